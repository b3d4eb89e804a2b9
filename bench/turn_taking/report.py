"""Figures per class and system, the tuning search, and the results page."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from bench.turn_taking.clips import Clip

KINDS = ("complete", "pause", "list", "hesitation", "backchannel")
PAUSED_KINDS = ("pause", "list", "hesitation")  # a turn that ends before the speech does is cut off


@dataclass(frozen=True)
class Outcome:
    """One clip under one system: its first speech start and turn end (seconds into the clip)."""

    start_s: float | None
    end_s: float | None
    interrupted: bool = False  # backchannels: the agent's reply would be cut (not only paused)


@dataclass(frozen=True)
class ClassFigures:
    n: int
    wait_p50_ms: float | None  # from the end of speech, over the turns that ended after it
    wait_p95_ms: float | None
    cut_rate: float | None  # the turn ended before the speech did (inside a pause, or in the words)
    false_interruption_rate: float | None  # backchannels over the agent's reply


def class_figures(clips: Sequence[Clip], outcomes: dict[str, Outcome]) -> dict[str, ClassFigures]:
    figures = {}
    for kind in KINDS:
        mine = [c for c in clips if c.kind == kind and c.name in outcomes]
        if not mine:
            continue
        if kind == "backchannel":
            rate = sum(outcomes[c.name].interrupted for c in mine) / len(mine)
            figures[kind] = ClassFigures(len(mine), None, None, None, rate)
            continue
        waits, cut = [], 0
        for clip in mine:
            end_s = outcomes[clip.name].end_s
            if end_s is not None and end_s < clip.speech_end_s:
                cut += 1
            elif end_s is not None:
                waits.append(1000 * (end_s - clip.speech_end_s))
        p50 = float(np.percentile(waits, 50)) if waits else None
        p95 = float(np.percentile(waits, 95)) if waits else None
        figures[kind] = ClassFigures(len(mine), p50, p95, cut / len(mine), None)
    return figures


def tuning_cost(
    clips: Sequence[Clip], outcomes: dict[str, Outcome], max_cut_rate: float = 0.05
) -> tuple[float, ...]:
    """Smaller is better: first keep within `max_cut_rate` the turns ended too early, over all paused
    clips together (pauses, lists, hesitations) and over the complete ones; then the complete turns' p50
    wait; then the paused ones'."""
    figures = class_figures(clips, outcomes)
    paused = [c for c in clips if c.kind in PAUSED_KINDS]
    ends = [outcomes[c.name].end_s for c in paused]
    cut = sum(e is not None and e < c.speech_end_s for c, e in zip(paused, ends, strict=True))
    early = figures["complete"].cut_rate or 0.0
    over = max(0.0, cut / max(1, len(paused)) - max_cut_rate) + max(0.0, early - max_cut_rate)
    complete_wait = figures["complete"].wait_p50_ms or 1e9
    paused_waits = [figures[k].wait_p50_ms or 1e9 for k in PAUSED_KINDS if k in figures]
    return (over, complete_wait, float(np.mean(paused_waits)) if paused_waits else 0.0)


def grid(base: object, **values: Sequence[object]) -> list[object]:
    """Every combination of `values` on a frozen dataclass `base` (invalid ones left out)."""
    options = []
    for combo in itertools.product(*values.values()):
        try:
            options.append(type(base)(**{**asdict(base), **dict(zip(values, combo, strict=True))}))  # type: ignore[call-overload]
        except ValueError:
            continue
    return options


def best(options: Sequence[object], cost: Callable[[object], tuple[float, ...]]) -> object:
    return min(options, key=cost)


def misses(recordings: Sequence[object], outcomes: dict[str, Outcome]) -> list[str]:
    """Markdown bullets: the clips cut off (and what was heard then), complete ones kept waiting over a
    second, backchannels that interrupted (and their transcripts)."""
    lines = []
    for rec in recordings:
        clip, outcome = rec.clip, outcomes[rec.clip.name]  # type: ignore[attr-defined]
        end_s = outcome.end_s
        known = [s for s in rec.scored if end_s is not None and s.known_ns / 1e9 <= end_s]  # type: ignore[attr-defined]
        heard = f"{known[-1].text!r} (score {known[-1].score})" if known else "nothing scored"
        if clip.kind == "backchannel" and outcome.interrupted:
            texts = sorted({s.text for s in rec.scored} | {rec.final_text})  # type: ignore[attr-defined]
            lines.append(f"- interrupted by {clip.text!r} ({clip.voice}): heard {texts}")
        elif clip.kind != "backchannel" and end_s is not None and end_s < clip.speech_end_s:
            lines.append(f"- cut off: {clip.text!r} ({clip.voice}) at {end_s:.2f} s, heard {heard}")
        elif clip.kind == "complete" and end_s is not None and end_s - clip.speech_end_s > 1.0:
            lines.append(
                f"- waited {end_s - clip.speech_end_s:.1f} s: {clip.text!r} ({clip.voice}), heard {heard}"
            )
    return lines or ["- nothing"]


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def table(systems: dict[str, dict[str, ClassFigures]]) -> list[str]:
    """One markdown row per class and system."""
    rows = [
        "| class | n | system | endpoint wait p50 (ms) | p95 (ms) | cut off | false interruptions |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for name, figures in systems.items():
            f = figures.get(kind)
            if f is None:
                continue
            rows.append(
                f"| {kind} | {f.n} | {name} | {_ms(f.wait_p50_ms)} | {_ms(f.wait_p95_ms)} | "
                f"{_rate(f.cut_rate)} | {_rate(f.false_interruption_rate)} |"
            )
    return rows
