"""How many tokens to draft: a fixed gamma, or an adaptive length from measured costs and acceptance.

Drafting one more token costs a draft step (plus the extra verify row); it pays off only if it is
accepted, and it can only be accepted if every token before it was. So after drafting tokens 1..k with
draft confidences c_1..c_k (the draft's probability of its own choice), drafting token k+1 is worth it when

    c_1 * ... * c_k * acceptance  *  target_step_s   >   draft_step_s + verify_row_s

where `acceptance` is the running rate at which drafted tokens are accepted, and the costs are measured
as the engine runs. With nothing measured yet the policy drafts up to its maximum. When not even the
first token pays, the block is a plain step; every PROBE_EVERY such blocks one token is drafted anyway,
so the estimates keep tracking a conversation whose text becomes easier to predict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

AUTO_MAX_GAMMA = 8
PROBE_EVERY = 8
EMA_WEIGHT = 0.1  # weight of a new observation in the running means


@dataclass
class RunningMean:
    value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else (1 - EMA_WEIGHT) * self.value + EMA_WEIGHT * x


@dataclass
class SpeculationStats:
    """What the policy learns as the engine runs (shared by all generations on one engine).

    Measured seconds of one draft step and of a target forward by number of tokens verified, and the
    running rate at which drafted tokens are accepted.
    """

    draft_step: RunningMean = field(default_factory=RunningMean)
    verify: dict[int, RunningMean] = field(default_factory=dict)
    acceptance: RunningMean = field(default_factory=lambda: RunningMean(0.7))
    skipped: int = 0  # plain blocks since the last probe

    def record(self, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float) -> None:
        if n_drafted:
            self.draft_step.add(draft_s / n_drafted)
            # Per-token acceptance over the tokens that had a chance (none after the first rejection).
            self.acceptance.add(n_accepted / min(n_drafted, n_accepted + 1))
        self.verify.setdefault(n_drafted + 1, RunningMean()).add(verify_s)

    def _measured(self) -> list[tuple[int, float]]:
        return sorted((n, mean.value) for n, mean in self.verify.items() if mean.value is not None)

    def verify_row_s(self) -> float:
        """Marginal cost of one more verified row, from the smallest and largest sizes measured."""
        measured = self._measured()
        if len(measured) < 2:
            return 0.0
        (n_low, low), (n_high, high) = measured[0], measured[-1]
        return max(0.0, (high - low) / (n_high - n_low))

    def target_step_s(self) -> float | None:
        """One-token target forward, extrapolated from the smallest verify measured."""
        measured = self._measured()
        if not measured:
            return None
        n, seconds = measured[0]
        return max(seconds - (n - 1) * self.verify_row_s(), 1e-6)


@dataclass
class DraftLength:
    """Decides, token by token, whether to draft one more. `adaptive=False` always drafts `max_gamma`."""

    max_gamma: int
    stats: SpeculationStats
    adaptive: bool = False

    @classmethod
    def parse(cls, gamma: int | str, stats: SpeculationStats) -> DraftLength:
        if gamma == "auto":
            return cls(AUTO_MAX_GAMMA, stats, adaptive=True)
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
            raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}")
        return cls(gamma, stats)

    def should_draft(self, n_drafted: int, confidence: float, limit: int) -> bool:
        """Draft token n_drafted + 1? `confidence` is the product of the drafted tokens' confidences."""
        if n_drafted >= min(limit, self.max_gamma):
            return False
        if not self.adaptive:
            return True
        worth = self._worth_drafting(confidence)
        if n_drafted == 0:
            if not worth and self.stats.skipped + 1 < PROBE_EVERY:
                self.stats.skipped += 1
                return False
            self.stats.skipped = 0
            return True
        return worth

    def _worth_drafting(self, confidence: float) -> bool:
        target_step, draft_step = self.stats.target_step_s(), self.stats.draft_step.value
        if target_step is None or draft_step is None:
            return True  # nothing measured yet: draft, and measure
        acceptance = self.stats.acceptance.value if self.stats.acceptance.value is not None else 0.7
        gain = confidence * acceptance * target_step
        return gain > draft_step + self.stats.verify_row_s()
