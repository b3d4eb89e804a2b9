"""Statistics of a run: order statistics of a stage over turns, and speculative-decoding figures.

Percentiles are numpy's default (linear interpolation between the closest ranks), rounded to the
nanosecond, the trace's own resolution. `percentile` is the voiceagent wing's one percentile: the
benchmarks (`voiceagent bench`, bench/) and the tests' fuzzing use it too, through `latency_summary`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NS_DIGITS = 6  # ms rounded to this many decimals is the nanosecond


@dataclass
class Stats:
    """Order statistics of one stage over a run's turns, in ms; None where there were no values."""

    n: int
    p50: float | None = None
    p95: float | None = None
    max: float | None = None
    mean: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "p50": rounded(self.p50),
            "p95": rounded(self.p95),
            "max": rounded(self.max),
            "mean": rounded(self.mean),
        }


def percentile(values: Iterable[float], q: float) -> float | None:
    """The `q`-th percentile (0 to 100) of `values`, numpy's default: linear interpolation between the
    closest ranks (p95 of [100, 200, 300, 400, 1000] is 400 + 0.8 * 600 = 880); None when there are none."""
    data = np.asarray(list(values), dtype=np.float64)
    return float(np.percentile(data, q)) if data.size else None


def percentiles(values: Iterable[float]) -> Stats:
    """n, median, 95th percentile, max and mean of `values`, each rounded to the nanosecond, the trace's
    resolution (numpy's 879.9999999999999 is 880)."""
    data = list(values)
    if not data:
        return Stats(0)
    figures = (percentile(data, 50.0), percentile(data, 95.0), float(max(data)), float(np.mean(data)))
    return Stats(len(data), *(rounded(value, NS_DIGITS) for value in figures))


def latency_summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50, p95 and max of latencies in ms, rounded to 0.1 ms, and their count: the benchmarks' figures."""
    return {
        "p50": rounded(percentile(values, 50.0), 1),
        "p95": rounded(percentile(values, 95.0), 1),
        "max": rounded(float(max(values)), 1) if values else None,
        "n": len(values),
    }


@dataclass
class Speculative:
    """Speculative-decoding figures of one turn or a whole run, from the `llm.block` records.

    `tokens`, `drafted` and `accepted` add up the blocks' `n_tokens`, `n_drafted` and `n_accepted` (a null
    count adds nothing). `decode_ms` / `decode_tokens` is the time from the first block to the last, over
    the tokens committed after the first block: its ratio is the decoding speed seen by the listener."""

    blocks: int = 0
    blocks_with_tokens: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    decode_ms: float = 0.0
    decode_tokens: int = 0
    preemptive_turns: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted (None when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_block(self) -> float | None:
        """Tokens per committed block, over the blocks whose token count is known."""
        return self.tokens / self.blocks_with_tokens if self.blocks_with_tokens else None

    @property
    def ms_per_token(self) -> float | None:
        """(last block time - first block time) / (tokens - the first block's tokens), when defined."""
        return self.decode_ms / self.decode_tokens if self.decode_tokens else None

    def add(self, other: Speculative) -> Speculative:
        """The sum of two sets of figures (a run's figures add up its turns')."""
        return Speculative(
            blocks=self.blocks + other.blocks,
            blocks_with_tokens=self.blocks_with_tokens + other.blocks_with_tokens,
            tokens=self.tokens + other.tokens,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            decode_ms=self.decode_ms + other.decode_ms,
            decode_tokens=self.decode_tokens + other.decode_tokens,
            preemptive_turns=self.preemptive_turns + other.preemptive_turns,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "tokens": self.tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": rounded(self.acceptance_rate, 4),
            "tokens_per_block": rounded(self.tokens_per_block, 4),
            "ms_per_token": rounded(self.ms_per_token),
            "preemptive_turns": self.preemptive_turns,
        }


def speculative_words(figures: Speculative) -> str:
    """One line about the speculative decoding, e.g. for a table's footer."""
    rate, per_block, per_token = figures.acceptance_rate, figures.tokens_per_block, figures.ms_per_token
    return (
        f"speculative: {figures.blocks} blocks, {figures.tokens} tokens, "
        f"{figures.accepted}/{figures.drafted} drafted accepted"
        + ("" if rate is None else f" ({100 * rate:.1f}%)")
        + ("" if per_block is None else f", {per_block:.2f} tokens/block")
        + ("" if per_token is None else f", {per_token:.1f} ms/token")
        + ("" if not figures.preemptive_turns else f", {figures.preemptive_turns} preemptive turn(s)")
    )


def rounded(value: float | None, digits: int = 3) -> float | None:
    """`value` rounded for JSON (ms to the microsecond by default); None stays None."""
    return None if value is None else round(value, digits)
