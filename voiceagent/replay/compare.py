"""Comparing two runs stage by stage, and deciding which stages regressed.

The rule: a stage REGRESSES when both runs have it and its p50 grew by more than `threshold_ms` AND by more
than `threshold_pct` percent of the base p50 (both must be exceeded: a few ms on a fast stage, or a few
percent of a slow one, is noise). A base p50 of 0 makes any growth above `threshold_ms` count. The p95 is
shown but does not decide: a handful of turns makes it jumpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from voiceagent.replay.analysis import STAGE_TITLES, STAGES, RunSummary


@dataclass
class StageDelta:
    """One stage in both runs: p50 and p95 of each (ms, None when a run lacks the stage), and the change."""

    stage: str
    base_p50: float | None
    base_p95: float | None
    new_p50: float | None
    new_p95: float | None
    regressed: bool = False

    @property
    def p50_delta(self) -> float | None:
        return _minus(self.new_p50, self.base_p50)

    @property
    def p95_delta(self) -> float | None:
        return _minus(self.new_p95, self.base_p95)

    @property
    def p50_delta_pct(self) -> float | None:
        """The p50's change in percent of the base p50 (None when the base p50 is missing or 0)."""
        if self.p50_delta is None or not self.base_p50:
            return None
        return 100.0 * self.p50_delta / self.base_p50

    def to_json(self) -> dict[str, Any]:
        return {
            "base": {"p50": _round(self.base_p50), "p95": _round(self.base_p95)},
            "new": {"p50": _round(self.new_p50), "p95": _round(self.new_p95)},
            "p50_delta_ms": _round(self.p50_delta),
            "p95_delta_ms": _round(self.p95_delta),
            "p50_delta_pct": _round(self.p50_delta_pct, 2),
            "regressed": self.regressed,
        }


@dataclass
class Comparison:
    """Two runs side by side: a StageDelta per stage (in STAGES order) and the thresholds used."""

    base_label: str
    new_label: str
    stages: list[StageDelta]
    threshold_ms: float
    threshold_pct: float

    @property
    def regressed(self) -> list[str]:
        """The names of the stages that regressed (empty: the new run is no slower)."""
        return [delta.stage for delta in self.stages if delta.regressed]

    def stage(self, name: str) -> StageDelta:
        return next(delta for delta in self.stages if delta.stage == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "base": self.base_label,
            "new": self.new_label,
            "threshold_ms": self.threshold_ms,
            "threshold_pct": self.threshold_pct,
            "regressed": self.regressed,
            "stages": {delta.stage: delta.to_json() for delta in self.stages},
        }

    def text_table(self) -> str:
        """The comparison as a plain-text table for the terminal; regressed stages are marked."""
        lines = [
            f"compare: base = {self.base_label}",
            f"         new  = {self.new_label}",
            f"  {'stage':<18}{'base p50':>10}{'new p50':>10}{'delta':>10}{'%':>8}"
            f"{'base p95':>10}{'new p95':>10}{'delta':>10}",
        ]
        for delta in self.stages:
            pct = delta.p50_delta_pct
            lines.append(
                f"  {STAGE_TITLES.get(delta.stage, delta.stage):<18}"
                f"{_ms(delta.base_p50):>10}{_ms(delta.new_p50):>10}{_signed(delta.p50_delta):>10}"
                f"{'-' if pct is None else f'{pct:+.1f}':>8}"
                f"{_ms(delta.base_p95):>10}{_ms(delta.new_p95):>10}{_signed(delta.p95_delta):>10}"
                + ("  REGRESSED" if delta.regressed else "")
            )
        rule = f"(the rule: p50 up by > {self.threshold_ms:g} ms and > {self.threshold_pct:g}%)"
        names = ", ".join(STAGE_TITLES.get(name, name) for name in self.regressed)
        verdict = f"REGRESSED: {names}" if self.regressed else "no stage regressed"
        lines.append(f"  {verdict} {rule}")
        return "\n".join(lines)


def compare(
    base: RunSummary, new: RunSummary, threshold_ms: float = 50.0, threshold_pct: float = 10.0
) -> Comparison:
    """Each stage's p50/p95 in `base` and `new`, flagged where `new` regressed (see the module's rule)."""
    deltas = []
    for name in STAGES:
        before, after = base.stages[name], new.stages[name]
        delta = StageDelta(name, before.p50, before.p95, after.p50, after.p95)
        delta.regressed = is_regression(before.p50, after.p50, threshold_ms, threshold_pct)
        deltas.append(delta)
    return Comparison(base.label, new.label, deltas, threshold_ms, threshold_pct)


def is_regression(
    base_p50: float | None, new_p50: float | None, threshold_ms: float, threshold_pct: float
) -> bool:
    """True when the p50 grew by more than `threshold_ms` and by more than `threshold_pct` percent."""
    if base_p50 is None or new_p50 is None:
        return False
    growth = new_p50 - base_p50
    if growth <= threshold_ms:
        return False
    return base_p50 <= 0 or 100.0 * growth / base_p50 > threshold_pct


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
