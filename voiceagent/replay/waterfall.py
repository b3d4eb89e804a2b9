"""Waterfall pictures of turns, drawn with matplotlib: one bar per stage in ms from the end of the user's
speech (the dashed line at 0), committed blocks as ticks, voice-to-voice as a dotted line with its figure.
With several runs the bars of the same turn are drawn side by side in one picture, told apart by hatching.

Pictures are drawn on `matplotlib.figure.Figure` objects, never through pyplot, so no global figure state is
touched and no GUI backend is loaded: `savefig` picks the SVG or Agg (PNG) renderer for the one call. Text
from a trace has its `$` escaped (matplotlib would read it as mathtext).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import matplotlib
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from voiceagent.replay.analysis import RunSummary, TurnTiming
from voiceagent.replay.chrome import SPAN_LANES

MAX_PNG_TURNS = 6
PNG_DPI = 100
LANE_COLOURS = {
    "user speech": "#9e9e9e",
    "endpointing": "#f4a259",
    "ASR final": "#5b8e7d",
    "LLM first block": "#3d5a80",
    "LLM decoding": "#98c1d9",
    "first phrase": "#e0c872",
    "TTS": "#bc4b51",
    "audio out": "#8cb369",
}
RUN_HATCHES = ("", "//", "..", "xx")
RUN_ALPHAS = (1.0, 0.75, 0.6, 0.5)


class RunTurn(NamedTuple):
    """A turn to draw, with its run's number on the page (`tag`, shown with several runs) and label."""

    tag: str
    label: str
    turn: TurnTiming


def waterfall_figure(entries: Sequence[RunTurn], title: str, width_in: float = 9.0) -> Figure:
    """One turn's waterfall; the entries (the same turn in several runs) are drawn side by side per lane."""
    lanes = [lane for lane in SPAN_LANES if any(s.label == lane for e in entries for s in e.turn.spans)]
    rows = max(len(lanes), 1)
    height_in = 1.2 + 0.3 * rows * max(1.0, len(entries) * 0.7)
    figure = Figure(figsize=(width_in, height_in), layout="constrained")
    axes = figure.add_subplot()
    draw_turn(axes, entries, lanes, legend=True)
    axes.set_title(plain(title), fontsize=10, loc="left")
    return figure


def draw_turn(
    axes: Axes,
    entries: Sequence[RunTurn],
    lanes: list[str],
    legend: bool,
    xlim: tuple[float, float] | None = None,
) -> None:
    """Bars per lane (one row per lane, runs side by side within it), block ticks, the speech-end line and
    each run's voice-to-voice; `xlim` defaults to `x_range` of the entries."""
    left, right = xlim or x_range([entry.turn for entry in entries])
    height = 0.8 / len(entries)
    for k, entry in enumerate(entries):
        row_offset = -0.4 + height * (k + 0.5)
        _draw_bars(axes, entry.turn, lanes, k, row_offset, height, (left, right))
        v2v = entry.turn.stages.get("voice_to_voice")
        if v2v is not None:
            note = f"voice-to-voice {v2v:.0f} ms" + (f" ({entry.tag})" if len(entries) > 1 else "")
            _draw_v2v(axes, v2v, note, k, near_right=v2v > left + 0.7 * (right - left))
    axes.axvline(0.0, color="black", linestyle="--", linewidth=1.0)
    axes.set_xlim(left, right)
    axes.set_yticks(range(len(lanes)), [plain(lane) for lane in lanes], fontsize=8)
    axes.set_ylim(len(lanes) - 0.5 if lanes else 0.5, -0.5)
    typed = [entry.turn.typed for entry in entries]
    origin = "the typed message" if all(typed) else "the end of speech" + (" or typing" if any(typed) else "")
    axes.set_xlabel(f"ms from {origin} (dashed line)", fontsize=8)
    axes.tick_params(axis="x", labelsize=8)
    axes.grid(axis="x", color="#dddddd", linewidth=0.6)
    axes.set_axisbelow(True)
    if legend and len(entries) > 1:
        _draw_legend(axes, entries)


def _draw_bars(
    axes: Axes,
    turn: TurnTiming,
    lanes: list[str],
    k: int,
    row_offset: float,
    height: float,
    bounds: tuple[float, float],
) -> None:
    """Run number `k`'s bars, and its committed blocks as ticks on the decoding lane."""
    left, right = bounds
    sliver = 0.003 * (right - left)  # a bar of 0 or 1 ms still shows
    for span in turn.spans:
        y = lanes.index(span.label) + row_offset
        width = max(span.end_ms - span.start_ms, sliver)
        axes.barh(
            y,
            width,
            left=span.start_ms,
            height=height * 0.9,
            color=LANE_COLOURS.get(span.label, "#777777"),
            alpha=RUN_ALPHAS[k % len(RUN_ALPHAS)],
            hatch=RUN_HATCHES[k % len(RUN_HATCHES)],
            edgecolor="#333333",
            linewidth=0.4,
        )
        if span.label == "user speech" and span.start_ms < left:  # it runs off the left edge
            axes.text(left, y, f" ← {-span.start_ms:.0f} ms of speech", fontsize=7, va="center")
    if turn.markers and "LLM decoding" in lanes:
        y = lanes.index("LLM decoding") + row_offset
        axes.plot([m.t_ms for m in turn.markers], [y] * len(turn.markers), "|", color="#1b1b1b", ms=9)


def _draw_v2v(axes: Axes, v2v: float, note: str, k: int, near_right: bool) -> None:
    """A dotted line at the first reply audio, its note at the top (left of the line near the right edge)."""
    axes.axvline(v2v, color="#c0392b", linestyle=":", linewidth=1.2)
    axes.annotate(
        note,
        xy=(v2v, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(-4 if near_right else 4, -4 - 11 * k),
        textcoords="offset points",
        ha="right" if near_right else "left",
        va="top",
        fontsize=8,
        color="#c0392b",
    )


def _draw_legend(axes: Axes, entries: Sequence[RunTurn]) -> None:
    """Which hatch is which run, under the picture."""
    handles: list[Artist] = [
        Patch(
            facecolor="#cccccc",
            hatch=RUN_HATCHES[k % len(RUN_HATCHES)],
            edgecolor="#333333",
            alpha=RUN_ALPHAS[k % len(RUN_ALPHAS)],
            label=plain(shorten(f"({entry.tag}) {entry.label}", 70)),
        )
        for k, entry in enumerate(entries)
    ]
    handles.append(Line2D([], [], color="#1b1b1b", marker="|", linestyle="", label="committed block"))
    figure = axes.get_figure()
    assert isinstance(figure, Figure)
    figure.legend(handles=handles, fontsize=7, loc="outside lower center", ncol=2, frameon=False)


def x_range(turns: Sequence[TurnTiming]) -> tuple[float, float]:
    """The ms shown: everything after the end of speech, and at most a third as much of the speech
    itself (a long utterance would squash the stages; its bar runs off the left edge)."""
    starts = [s.start_ms for t in turns for s in t.spans] + [m.t_ms for t in turns for m in t.markers]
    ends = [s.end_ms for t in turns for s in t.spans] + [m.t_ms for t in turns for m in t.markers]
    ends += [v2v for t in turns if (v2v := t.stages.get("voice_to_voice")) is not None]
    right = max([*ends, 100.0])
    left = min([*starts, 0.0])
    left = max(left, -max(right / 3, 200.0))
    margin = 0.03 * (right - left)
    return left - margin, right + margin


def turns_figure(run: RunSummary, turns: Sequence[TurnTiming], width_in: float = 12.0) -> Figure:
    """Several turns of one run, one waterfall under the other (the README picture)."""
    lane_sets = [[lane for lane in SPAN_LANES if any(s.label == lane for s in t.spans)] for t in turns]
    heights = [max(len(lanes), 1) * 0.26 + 0.8 for lanes in lane_sets] or [1.0]
    figure = Figure(figsize=(width_in, sum(heights) + 0.6), layout="constrained")
    figure.suptitle(plain(shorten(f"{run.label}: voice-to-voice per turn", 110)), fontsize=12)
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    shared = x_range(turns)  # one scale for every turn of the picture
    for row, (turn, lanes) in enumerate(zip(turns, lane_sets, strict=True)):
        axes = figure.add_subplot(grid[row])
        draw_turn(axes, [RunTurn("", run.label, turn)], lanes, legend=False, xlim=shared)
        axes.set_title(plain(turn_title(turn)), fontsize=9, loc="left")
    if not turns:
        axes = figure.add_subplot(grid[0])
        axes.text(0.5, 0.5, "no turns in this run", ha="center", va="center", transform=axes.transAxes)
        axes.set_axis_off()
    return figure


def svg_of(figure: Figure) -> str:
    """The figure as an inline <svg> element: no XML prolog, no metadata, scaled by the page (viewBox)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path"}):
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r'<svg\1 width="100%"', text, count=1)
    return text.replace("<svg", '<svg role="img" class="waterfall"', 1)


def write_png(path: Path | str, run: RunSummary, turn: int | None = None) -> None:
    """A PNG waterfall ~1200 px wide: the turn at index `turn` of `run.turns`, or (None) the first
    MAX_PNG_TURNS turns that have something to draw."""
    drawable = [t for t in run.turns if t.spans]
    turns = [run.turns[turn]] if turn is not None else drawable[:MAX_PNG_TURNS]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    turns_figure(run, turns).savefig(path, format="png", dpi=PNG_DPI)


def turn_title(turn: TurnTiming) -> str:
    """A one-line description of a turn, for captions and picture titles."""
    v2v = turn.stages.get("voice_to_voice")
    said = f"“{shorten(turn.transcript, 70)}”" if turn.transcript else "(no transcript)"
    timing = f"voice-to-voice {v2v:.0f} ms" if v2v is not None else "no voice-to-voice"
    kind = "typed, " if turn.typed else ""
    return f"session {turn.session} turn {turn.turn} ({kind}{turn.outcome}): {said}, {timing}"


def plain(text: str) -> str:
    """Text for matplotlib: `$` would start mathtext."""
    return text.replace("$", r"\$")


def shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
