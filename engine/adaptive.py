"""How many tokens to draft: a fixed gamma, or an adaptive length from measured costs and acceptance.

Drafting one more token costs a draft step plus the extra verify row; it pays off only if it is accepted,
and it can only be accepted if every token before it was. So after drafting tokens 1..k with draft
confidences c_1..c_k (the draft's probability of its own choice), drafting token k+1 is worth it when

    c_1 * ... * c_k * acceptance  *  target_step_s   >   draft_step_s + (verify_s(k+2) - verify_s(k+1))

where `acceptance` is the rate at which this generation's drafted tokens are accepted and verify_s(n) the
cost of a target forward of n ids. A verify's cost is not linear in its rows (on a CPU a forward of 2+ ids
may take another kernel than a one-id step), so the costs are a table by size: calibrated once per engine
before its first adaptive block (`Engine.calibrate`: a few timed forwards of every size the policy may ask
for), then kept up to date by the blocks themselves. Whether a block drafts at all is decided over the whole
length: some g in 1..max must be expected to beat a plain step (sum of acceptance^i over i = 1..g target
steps won, against g draft steps and the larger verify). When none does, the block is a plain step. A probe
(one token drafted anyway) keeps the acceptance tracking a conversation whose text becomes easier to
predict, but a probe is not free: the draft first catches up on every id committed since it last ran. So
probes come after PROBE_EVERY plain blocks, then twice as far apart after each probe that did not make
drafting pay (up to MAX_PROBE_EVERY), and never where drafting could not pay even if every token were
accepted (a draft as slow as the target, or a verify of 2 ids costing two steps). A probe also waits while
the probes so far and its own expected cost (the catch-up at the draft's measured seconds an id, one draft
step and the verify's extra row) would exceed PROBE_BUDGET of the time the blocks have run: where drafting
never pays (2 CPU cores: AMD EPYC AVX-512, a 0.5B draft's catch-up on a 60-id conversation ~0.3 s against a
38 ms step) probes then cost at most that share, instead of 2-9% of a run of 64-token replies (20% of one).
The model is checked against what the drafting blocks of this generation really cost per committed token:
when that is more than a plain step, its blocks are plain (with probes) until it is not. That check, and the
acceptance the model weighs, are a generation's own: each generation starts from the engine's long-run
acceptance (over about the last ACCEPTANCE_PRIOR_BLOCKS blocks, several replies) and follows its own text
from there. Text that is hard to predict (a chat answer whose acceptance fell to 0.4 by its end) must not
keep the next reply (code, a list) from drafting until a probe happens by (the bench's C prompt after a chat
answer: 61 of 63 blocks plain, 0.97x its own plain decoding, where it drafts at 1.5x after code).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

AUTO_MAX_GAMMA = 8
PROBE_EVERY = 8
MAX_PROBE_EVERY = 64
BEST_ACCEPTANCE = 0.98  # what the most predictable text (a repeated passage) reaches
EMA_WEIGHT = 0.1  # weight of a new observation in the running means
ACCEPTANCE_PRIOR_BLOCKS = 50  # the engine's long-run acceptance, which each generation starts from, follows
# about this many blocks
PACE_WEIGHT = 0.3  # weight of a block's pace in the running pace (a shared machine's speed moves in seconds)
PROBE_BUDGET = 0.02  # the most of the blocks' time that probes may cost beyond the plain steps they replace
RECENT_DRAFTED_BLOCKS = 8  # the generation's check weighs this many of its latest drafting blocks ...
LEAST_DRAFTED_BLOCKS = 2  # ... and waits for this many: one rejected token alone costs ~1.4 plain steps


@dataclass
class RunningMean:
    value: float | None = None
    weight: float = EMA_WEIGHT  # of a new observation

    def add(self, x: float) -> None:
        self.value = x if self.value is None else (1 - self.weight) * self.value + self.weight * x


@dataclass
class SpeculationStats:
    """What the policy learns as the engine runs (shared by all generations on one engine).

    Seconds of one draft step and of a target forward by number of ids verified (calibrated, then
    measured), and the long-run rate at which drafted tokens are accepted (each generation starts from it).
    """

    draft_step: RunningMean = field(default_factory=RunningMean)
    verify: dict[int, RunningMean] = field(default_factory=dict)
    acceptance: RunningMean = field(default_factory=lambda: RunningMean(0.7, 1 / ACCEPTANCE_PRIOR_BLOCKS))
    skipped: int = 0  # plain blocks since the last probe
    probe_every: int = PROBE_EVERY  # plain blocks between probes (doubles while probes find no gain)
    calibrated: bool = False
    # How fast the machine runs now against the table: a block's verify seconds over the table's seconds for
    # its size. A shared 2-core machine's speed moves by 25-40% within a run, within seconds (AMD EPYC: a
    # one-id step 19 ms, then 27, then 19 again), and a table of running means in seconds then mixes paces:
    # sizes not verified for a while keep an old pace, and the drafted blocks' cost, measured at a slow pace,
    # would stop drafting for good once plain steps ran at a fast one. So the table, the draft step and the
    # drafted blocks' cost are kept at the table's pace (seconds / pace), comparable whenever measured;
    # `verify_s` and `draft_step_s` give seconds at the pace now.
    pace: float = 1.0
    # The probe budget: seconds of every block recorded (catch-ups included), seconds the probes cost
    # beyond a plain step per token they committed, and a draft catch-up's seconds an id (measured).
    run_s: float = 0.0
    probe_overhead_s: float = 0.0
    catch_up_id_s: RunningMean = field(default_factory=RunningMean)
    probing: bool = False  # the next block recorded is a probe

    def calibrate(self, verify_s: dict[int, float], draft_step_s: float | None) -> None:
        """Seeds the cost table with forwards timed on this machine (sizes not given are interpolated)."""
        for n_rows, seconds in verify_s.items():
            self.verify[n_rows] = RunningMean(seconds)
        if draft_step_s is not None:
            self.draft_step = RunningMean(draft_step_s)
        self.pace = 1.0
        self.calibrated = True

    def record(
        self,
        n_drafted: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        n_rows: int | None = None,
        *,
        catch_up_s: float = 0.0,
        n_caught_up: int = 0,
        n_draft_forwards: int | None = None,
    ) -> float | None:
        """One block: `n_rows` ids verified in `verify_s` (default n_drafted + 1: one pending id), after
        the draft caught up on `n_caught_up` committed ids in `catch_up_s` (not part of `draft_s`).
        `n_draft_forwards`: the draft forwards `draft_s` paid for (default n_drafted; one fewer where the
        first drafted token came from a turn score's forward, `ModelState.next_logits`).

        Returns what a drafting block cost per committed token, at the table's pace (None for a plain
        block, and for a first block, whose verify also prefilled the prompt's tail)."""
        rows = n_drafted + 1 if n_rows is None else n_rows
        self._follow_pace(rows, verify_s)
        spent = catch_up_s + draft_s + verify_s
        self.run_s += spent
        if n_caught_up:
            self.catch_up_id_s.add(catch_up_s / n_caught_up)
        if self.probing and n_drafted:
            step = self.target_step_s() or verify_s
            self.probe_overhead_s += max(0.0, spent - (n_accepted + 1) * step)
        self.probing = False
        drafted_token_s = None
        if n_drafted:
            if rows - n_drafted <= 2:  # not a first block, whose verify also prefilled the prompt's tail
                drafted_token_s = (draft_s + verify_s) / (n_accepted + 1) / self.pace
            forwards = n_drafted if n_draft_forwards is None else n_draft_forwards
            if forwards:
                self.draft_step.add(draft_s / forwards / self.pace)
            self.acceptance.add(block_acceptance(n_drafted, n_accepted))
        self.verify.setdefault(rows, RunningMean()).add(verify_s / self.pace)
        return drafted_token_s

    def _follow_pace(self, rows: int, verify_s: float) -> None:
        """Moves the pace toward this verify's seconds over the table's, for a size within the calibrated
        ones (not a first block's prompt tail, which the table only extrapolates to)."""
        measured = self._measured()
        expected = self.table_s(rows)
        if expected is None or expected <= 0.0 or rows > measured[-1][0]:
            return
        self.pace = (1 - PACE_WEIGHT) * self.pace + PACE_WEIGHT * verify_s / expected

    def _measured(self) -> list[tuple[int, float]]:
        return sorted((n, mean.value) for n, mean in self.verify.items() if mean.value is not None)

    def verify_s(self, n_rows: int) -> float | None:
        """Seconds of a target forward of `n_rows` ids at the pace now: measured, else interpolated between
        the nearest sizes measured (extrapolated from the two nearest past either end; flat from a single
        size)."""
        seconds = self.table_s(n_rows)
        return None if seconds is None else seconds * self.pace

    def draft_step_s(self) -> float | None:
        """Seconds of one draft step at the pace now."""
        return None if self.draft_step.value is None else self.draft_step.value * self.pace

    def table_s(self, n_rows: int) -> float | None:
        """`verify_s` at the table's pace."""
        measured = self._measured()
        if not measured:
            return None
        exact = dict(measured)
        if n_rows in exact:
            return exact[n_rows]
        below = [(n, s) for n, s in measured if n < n_rows]
        above = [(n, s) for n, s in measured if n > n_rows]
        if below and above:
            (n0, s0), (n1, s1) = below[-1], above[0]
        elif len(measured) == 1:
            return measured[0][1]
        else:
            (n0, s0), (n1, s1) = below[-2:] if below else above[:2]
        return max(s0 + (s1 - s0) * (n_rows - n0) / (n1 - n0), 1e-6)

    def forwards_grow_with_ids(self, factor: float = 2.0) -> bool:
        """True where a target forward of 9 ids costs over `factor` one-id steps (compute-bound: a CPU;
        2 cores: 1.7-1.85x with AVX-512 VNNI, 2.5x with AVX2; a GPU ~1.0-1.1x)."""
        one, nine = self.verify_s(1), self.verify_s(9)
        return one is not None and nine is not None and nine > factor * one

    def target_step_s(self) -> float | None:
        """One-id target forward: a plain decoding step."""
        return self.verify_s(1)


def block_acceptance(n_drafted: int, n_accepted: int) -> float:
    """A block's per-token acceptance over the tokens that had a chance (none after the first rejection)."""
    return n_accepted / min(n_drafted, n_accepted + 1)


@dataclass
class RecentDraftingCost:
    """Seconds per committed token over a generation's latest RECENT_DRAFTED_BLOCKS drafting blocks, by
    token (a block that committed 4 tokens counts 4 times a block that committed 1). One rejected block
    alone (at the start of a reply) stops nothing, nor do a few in a row after blocks that paid. A probe
    that beat a plain step starts the window afresh: the text became predictable again, and the blocks
    that stopped drafting no longer say what drafting costs (a chat answer's list after its preamble)."""

    blocks: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RECENT_DRAFTED_BLOCKS))

    def add(self, token_s: float, n_committed: int, *, restart: bool = False) -> None:
        if restart:
            self.blocks.clear()
        self.blocks.append((token_s * n_committed, n_committed))

    def token_s(self) -> float | None:
        if len(self.blocks) < LEAST_DRAFTED_BLOCKS:
            return None
        return sum(s for s, _ in self.blocks) / sum(n for _, n in self.blocks)


@dataclass
class DraftLength:
    """Decides, token by token, whether to draft one more. `adaptive=False` always drafts `max_gamma`."""

    max_gamma: int
    stats: SpeculationStats
    adaptive: bool = False
    # Seconds per committed token of this generation's recent blocks that drafted (at the table's pace): the
    # check on the cost model (a table timed at load on another context length, an acceptance that drifts)
    # that stops drafting when drafting is in fact slower than plain steps.
    drafted_cost: RecentDraftingCost = field(default_factory=RecentDraftingCost)
    # This generation's acceptance: from the engine's long-run rate, then following this text's blocks.
    acceptance: RunningMean = field(init=False)

    def __post_init__(self) -> None:
        self.acceptance = RunningMean(self.stats.acceptance.value)

    @classmethod
    def parse(cls, gamma: int | str, stats: SpeculationStats) -> DraftLength:
        if gamma == "auto":
            return cls(AUTO_MAX_GAMMA, stats, adaptive=True)
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0:
            raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}")
        return cls(gamma, stats)

    def record(
        self,
        n_drafted: int,
        n_accepted: int,
        draft_s: float,
        verify_s: float,
        n_rows: int | None = None,
        *,
        catch_up_s: float = 0.0,
        n_caught_up: int = 0,
        n_draft_forwards: int | None = None,
    ) -> None:
        """A block of this generation: into the shared stats (`SpeculationStats.record`), and its cost per
        committed token into this generation's check."""
        probe = self.stats.probing
        cost = self.stats.record(
            n_drafted,
            n_accepted,
            draft_s,
            verify_s,
            n_rows,
            catch_up_s=catch_up_s,
            n_caught_up=n_caught_up,
            n_draft_forwards=n_draft_forwards,
        )
        if n_drafted:
            self.acceptance.add(block_acceptance(n_drafted, n_accepted))
        if cost is not None:
            plain = self.stats.table_s(1)
            beat_plain = probe and plain is not None and cost < plain
            self.drafted_cost.add(cost, n_accepted + 1, restart=beat_plain)

    def may_draft(self) -> bool:
        """Will the next block draft? False for gamma 0, and for "auto" while blocks are plain steps (the
        draft need not even be fed the prompt then: a probe catches it up)."""
        if not self.adaptive:
            return self.max_gamma > 0
        return self._drafting_pays(self.max_gamma)

    def should_draft(self, n_drafted: int, confidence: float, limit: int, catch_up_ids: int = 0) -> bool:
        """Draft token n_drafted + 1? `confidence` is the product of the drafted tokens' confidences;
        `catch_up_ids`, the committed ids the draft must be fed before its first token of the block."""
        most = min(limit, self.max_gamma)
        if n_drafted >= most:
            return False
        if not self.adaptive:
            return True
        if n_drafted == 0:
            return self._start_block(most, catch_up_ids)
        return self._next_pays(n_drafted, confidence)

    def _start_block(self, most: int, catch_up_ids: int) -> bool:
        stats = self.stats
        if self._drafting_pays(most):
            stats.skipped, stats.probe_every = 0, PROBE_EVERY
            return True
        if not self._block_pays(most, BEST_ACCEPTANCE):
            return False  # no text could make drafting pay on these costs: no probe either
        stats.skipped = min(stats.skipped + 1, stats.probe_every)
        if stats.skipped < stats.probe_every or not self._probe_affordable(catch_up_ids):
            return False
        stats.skipped, stats.probe_every = 0, min(2 * stats.probe_every, MAX_PROBE_EVERY)
        stats.probing = True
        return True

    def _probe_affordable(self, catch_up_ids: int) -> bool:
        """Would the probes so far and this one cost at most PROBE_BUDGET of the blocks' time? This one
        may cost its catch-up, a draft step and the verify's extra row (all rejected)."""
        stats = self.stats
        draft_step = stats.draft_step_s() or 0.0
        per_id = stats.catch_up_id_s.value if stats.catch_up_id_s.value is not None else draft_step
        expected = catch_up_ids * per_id + draft_step + self._extra_verify_s(1, 2)
        return stats.probe_overhead_s + expected <= PROBE_BUDGET * stats.run_s

    def _drafting_pays(self, most: int) -> bool:
        """Expected to pay on the cost model, and not measured slower than plain steps."""
        return self._block_pays(most) and not self._drafting_measured_slower()

    def _drafting_measured_slower(self) -> bool:
        """Did the blocks that drafted commit their tokens more slowly than plain steps would have?"""
        drafted, plain = self.drafted_cost.token_s(), self.stats.table_s(1)  # both at the table's pace
        return drafted is not None and plain is not None and drafted > plain

    def _costs(self) -> tuple[float, float, float] | None:
        target_step, draft_step = self.stats.target_step_s(), self.stats.draft_step_s()
        if target_step is None or draft_step is None:
            return None
        acceptance = self.acceptance.value if self.acceptance.value is not None else 0.7
        return target_step, draft_step, acceptance

    def _extra_verify_s(self, n_rows_from: int, n_rows_to: int) -> float:
        low, high = self.stats.verify_s(n_rows_from), self.stats.verify_s(n_rows_to)
        return 0.0 if low is None or high is None else max(0.0, high - low)

    def _block_pays(self, most: int, acceptance: float | None = None) -> bool:
        """Is some draft length 1..most expected to beat a plain step (at `acceptance`, default this
        generation's rate)?"""
        costs = self._costs()
        if costs is None:
            return True  # nothing measured yet: draft, and measure
        target_step, draft_step, running = costs
        acceptance = running if acceptance is None else acceptance
        won = 0.0
        for gamma in range(1, most + 1):
            won += acceptance**gamma * target_step
            if won > gamma * draft_step + self._extra_verify_s(1, gamma + 1):
                return True
        return False

    def _next_pays(self, n_drafted: int, confidence: float) -> bool:
        costs = self._costs()
        if costs is None:
            return True
        target_step, draft_step, acceptance = costs
        gain = confidence * acceptance * target_step
        return gain > draft_step + self._extra_verify_s(n_drafted + 1, n_drafted + 2)
