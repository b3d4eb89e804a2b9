"""Speculative-decoding statistics, named as vLLM names them (drafts, draft tokens, accepted tokens)."""

from __future__ import annotations

import copy
import threading
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class BlockTiming:
    draft_s: float  # the draft's gamma forward passes
    verify_s: float  # the target's one forward over the last committed id + the drafts
    committed_at: float  # engine clock when the block was committed


@dataclass
class GenerationStats:
    """Figures of one generation call."""

    n_prompt_tokens: int
    accepted_per_position: list[int]  # [gamma]: how often draft position i was accepted
    n_cached_prompt_tokens: int = 0  # prompt ids whose keys were already in the cache
    n_generated: int = 0
    n_blocks: int = 0
    n_drafts: int = 0  # blocks that had drafted tokens
    n_draft_tokens: int = 0
    n_accepted: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0  # call start -> first committed block
    total_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    n_proposed: int = 0  # ids of the caller's proposal handed to verification (engine/proposal.py)
    n_proposal_kept: int = 0  # of them, committed
    finish_reason: str | None = None

    def record_block(
        self, n_drafted: int, n_accepted: int, n_committed: int, draft_s: float, verify_s: float
    ) -> None:
        self.n_blocks += 1
        self.n_generated += n_committed
        self.draft_s += draft_s
        self.verify_s += verify_s
        if n_drafted:
            self.n_drafts += 1
            self.n_draft_tokens += n_drafted
            self.n_accepted += n_accepted
            for i in range(n_accepted):
                self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens."""
        return self.n_accepted / self.n_draft_tokens if self.n_draft_tokens else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Tokens committed per verification: 1 + accepted / drafts (vLLM's mean acceptance length)."""
        return 1.0 + self.n_accepted / self.n_drafts if self.n_drafts else 1.0

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of decoding (prefill excluded)."""
        return self.n_generated / self.decode_s

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.decode_s / self.n_generated if self.n_generated else 0.0

    def snapshot(self) -> GenerationStats:
        return copy.deepcopy(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_len": self.mean_accepted_len,
            "tokens_per_s": self.tokens_per_s,
            "ms_per_token": self.ms_per_token,
        }


@dataclass
class EngineMetrics:
    """Counters over the engine's life (thread-safe), for a metrics endpoint."""

    num_requests: int = 0
    num_generated_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    last: GenerationStats | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, stats: GenerationStats) -> None:
        with self._lock:
            self.num_requests += 1
            self.num_generated_tokens += stats.n_generated
            self.num_drafts += stats.n_drafts
            self.num_draft_tokens += stats.n_draft_tokens
            self.num_accepted_tokens += stats.n_accepted
            positions = stats.accepted_per_position
            if len(self.accepted_per_position) < len(positions):
                self.accepted_per_position += [0] * (len(positions) - len(self.accepted_per_position))
            for i, n in enumerate(positions):
                self.accepted_per_position[i] += n
            self.last = stats

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
