"""The replay report: one self-contained HTML file, and a PNG waterfall for a README.

The HTML needs nothing else to open: inline CSS, no script, and every picture an inline SVG drawn by
matplotlib. It holds a summary table per run (p50/p95/max per stage, speculative figures), the comparison
(regressed stages highlighted) when there is one, a table of every turn, and a waterfall picture per turn:
a bar per stage in ms from the end of the user's speech (the dashed line at 0), voice-to-voice marked. With
several runs the bars of the same turn (by position in each run) are drawn side by side in one picture.

Pictures are drawn on `matplotlib.figure.Figure` objects, never through pyplot, so no global figure state is
touched and no GUI backend is loaded: `savefig` picks the SVG or Agg (PNG) renderer for the one call. Every
string from a trace is escaped (html.escape for the page; `$` for matplotlib's mathtext in pictures).
"""

from __future__ import annotations

import html
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

from voiceagent.replay.analysis import STAGE_TITLES, STAGES, RunSummary, TurnTiming
from voiceagent.replay.chrome import SPAN_LANES
from voiceagent.replay.compare import Comparison

TITLE = "Voice agent replay report"
MAX_HTML_WATERFALLS = 40  # pictures in one report (each is tens of kB of SVG)
MAX_PNG_TURNS = 6
PNG_DPI = 100
LANE_COLOURS = {
    "user speech": "#9e9e9e",
    "endpointing": "#f4a259",
    "ASR final": "#5b8e7d",
    "LLM first block": "#3d5a80",
    "LLM decoding": "#98c1d9",
    "TTS": "#bc4b51",
    "audio out": "#8cb369",
}
RUN_HATCHES = ("", "//", "..", "xx")
RUN_ALPHAS = (1.0, 0.75, 0.6, 0.5)


# ----- pictures ----------------------------------------------------------------------------------


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
    axes.set_title(_plain(title), fontsize=10, loc="left")
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
        _draw_bars(axes, entry.turn, lanes, k, row_offset, height, left)
        v2v = entry.turn.stages.get("voice_to_voice")
        if v2v is not None:
            note = f"voice-to-voice {v2v:.0f} ms" + (f" ({entry.tag})" if len(entries) > 1 else "")
            _draw_v2v(axes, v2v, note, k, near_right=v2v > left + 0.7 * (right - left))
    axes.axvline(0.0, color="black", linestyle="--", linewidth=1.0)
    axes.set_xlim(left, right)
    axes.set_yticks(range(len(lanes)), [_plain(lane) for lane in lanes], fontsize=8)
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
    axes: Axes, turn: TurnTiming, lanes: list[str], k: int, row_offset: float, height: float, left: float
) -> None:
    """Run number `k`'s bars, and its committed blocks as ticks on the decoding lane."""
    for span in turn.spans:
        y = lanes.index(span.label) + row_offset
        width = max(span.end_ms - span.start_ms, 0.5)  # a 0 ms bar still shows as a sliver
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
            label=_plain(_short(f"({entry.tag}) {entry.label}", 70)),
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
    figure.suptitle(_plain(_short(f"{run.label}: voice-to-voice per turn", 110)), fontsize=12)
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    shared = x_range(turns)  # one scale for every turn of the picture
    for row, (turn, lanes) in enumerate(zip(turns, lane_sets, strict=True)):
        axes = figure.add_subplot(grid[row])
        draw_turn(axes, [RunTurn("", run.label, turn)], lanes, legend=False, xlim=shared)
        axes.set_title(_plain(_turn_title(turn)), fontsize=9, loc="left")
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


# ----- the page ----------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto;
       max-width: 1180px; padding: 0 16px; color: #1f2328; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #d0d7de; }
table { border-collapse: collapse; margin: 8px 0 16px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: right; vertical-align: top; }
th { background: #f6f8fa; } td.text, th.text { text-align: left; max-width: 320px; overflow-wrap: anywhere; }
td.said { min-width: 160px; } td.short { white-space: nowrap; }
tr.regressed td { background: #ffebe9; color: #82071e; font-weight: 600; }
.verdict { font-weight: 600; } .verdict.bad { color: #82071e; } .verdict.good { color: #116329; }
.muted { color: #656d76; } .problems li { font-family: ui-monospace, monospace; font-size: 12px; }
figure { margin: 12px 0 28px; } figcaption { font-size: 13px; margin-bottom: 4px; }
svg.waterfall { display: block; width: 100%; height: auto; max-width: 1000px; }
.outcome-error { color: #82071e; } .outcome-interrupted { color: #9a6700; }
"""


def write_html(path: Path | str, runs: list[RunSummary], comparison: Comparison | None = None) -> None:
    """Writes the report (see the module's docstring) to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(runs, comparison), encoding="utf-8")


def render_html(runs: list[RunSummary], comparison: Comparison | None = None) -> str:
    """The report as one HTML string."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{TITLE}</title><style>{CSS}</style></head><body>",
        f"<h1>{TITLE}</h1>",
        '<p class="muted">Every time is in ms from the end of the user\'s speech (the last voiced frame); '
        "voice-to-voice is the first reply audio handed to the transport. Percentiles interpolate "
        "linearly between turns.</p>",
    ]
    if comparison is not None:
        parts.append(_comparison_html(comparison))
    for index, run in enumerate(runs):
        parts.append(_run_html(run, index, len(runs)))
    parts.append(_waterfalls_html(runs))
    parts.append("</body></html>")
    return "\n".join(parts)


def _run_html(run: RunSummary, index: int, count: int) -> str:
    number = f"({index + 1}) " if count > 1 else ""
    outcomes = ", ".join(f"{n} {name}" for name, n in run.outcomes().items() if n) or "no turns"
    rows = []
    for name in STAGES:
        stats = run.stages[name]
        cells = "".join(f"<td>{_ms(v)}</td>" for v in (stats.p50, stats.p95, stats.max, stats.mean))
        rows.append(f'<tr><td class="text">{STAGE_TITLES[name]}</td><td>{stats.n}</td>{cells}</tr>')
    spec = run.speculative
    parts = [
        f'<section class="run"><h2>{number}{_e(run.label)}</h2>',
        f'<p class="muted">{_e(run.path)}: {len(run.turns)} turn(s), {outcomes}</p>',
        '<table class="stages"><tr><th class="text">stage</th><th>n</th><th>p50 ms</th><th>p95 ms</th>'
        "<th>max ms</th><th>mean ms</th></tr>",
        *rows,
        "</table>",
        '<table class="speculative"><tr><th>blocks</th><th>tokens</th><th>drafted</th><th>accepted</th>'
        "<th>acceptance</th><th>tokens/block</th><th>ms/token</th><th>preemptive turns</th></tr>",
        f"<tr><td>{spec.blocks}</td><td>{spec.tokens}</td><td>{spec.drafted}</td><td>{spec.accepted}</td>"
        f"<td>{_pct(spec.acceptance_rate)}</td><td>{_num(spec.tokens_per_block, 2)}</td>"
        f"<td>{_num(spec.ms_per_token, 1)}</td><td>{spec.preemptive_turns}</td></tr></table>",
    ]
    if run.problems:
        items = "".join(f"<li>{_e(problem)}</li>" for problem in run.problems)
        parts.append(
            f"<details><summary>{len(run.problems)} problem(s) in the trace (left out of the figures)"
            f'</summary><ul class="problems">{items}</ul></details>'
        )
    parts.append(_turns_table(run))
    parts.append("</section>")
    return "\n".join(parts)


def _turns_table(run: RunSummary) -> str:
    heads = "".join(f"<th>{STAGE_TITLES[name]} ms</th>" for name in STAGES)
    rows = [
        '<table class="turns"><tr><th>#</th><th class="text">session</th><th>turn</th><th class="text">'
        f'outcome</th><th class="text">heard</th><th class="text">replied</th>{heads}<th>blocks</th>'
        "<th>acceptance</th><th>ms/token</th></tr>"
    ]
    for index, turn in enumerate(run.turns, start=1):
        outcome = turn.outcome + (" (typed)" if turn.typed else "")
        title = f' title="{_e(turn.error)}"' if turn.error else ""
        stages = "".join(f"<td>{_ms(turn.stages[name])}</td>" for name in STAGES)
        spec = turn.speculative
        rows.append(
            f'<tr><td>{index}</td><td class="text short">{_e(turn.session)}</td><td>{turn.turn}</td>'
            f'<td class="text short outcome-{turn.outcome}"{title}>{_e(outcome)}</td>'
            f'<td class="text said">{_e(turn.transcript)}</td>'
            f'<td class="text said">{_e(turn.reply)}</td>{stages}'
            f"<td>{spec.blocks}</td><td>{_pct(spec.acceptance_rate)}</td>"
            f"<td>{_num(spec.ms_per_token, 1)}</td></tr>"
        )
    rows.append("</table>")
    return "\n".join(rows)


def _comparison_html(comparison: Comparison) -> str:
    rows = []
    for delta in comparison.stages:
        cls = ' class="regressed"' if delta.regressed else ""
        pct = delta.p50_delta_pct
        rows.append(
            f'<tr{cls}><td class="text">{STAGE_TITLES.get(delta.stage, _e(delta.stage))}'
            f"{' (regressed)' if delta.regressed else ''}</td>"
            f"<td>{_ms(delta.base_p50)}</td><td>{_ms(delta.new_p50)}</td><td>{_signed(delta.p50_delta)}</td>"
            f"<td>{'-' if pct is None else f'{pct:+.1f}%'}</td>"
            f"<td>{_ms(delta.base_p95)}</td><td>{_ms(delta.new_p95)}</td><td>{_signed(delta.p95_delta)}</td></tr>"
        )
    if comparison.regressed:
        names = ", ".join(STAGE_TITLES.get(name, name) for name in comparison.regressed)
        verdict = f'<p class="verdict bad">Regressed: {_e(names)}</p>'
    else:
        verdict = '<p class="verdict good">No stage regressed.</p>'
    return "\n".join(
        [
            '<section class="comparison"><h2>Comparison</h2>',
            f'<p class="muted">base: {_e(comparison.base_label)}<br>new: {_e(comparison.new_label)}<br>'
            f"A stage regresses when its p50 grows by more than {comparison.threshold_ms:g} ms and by more "
            f"than {comparison.threshold_pct:g}%.</p>",
            verdict,
            '<table><tr><th class="text">stage</th><th>base p50</th><th>new p50</th><th>&Delta; p50</th>'
            "<th>&Delta; %</th><th>base p95</th><th>new p95</th><th>&Delta; p95</th></tr>",
            *rows,
            "</table></section>",
        ]
    )


def _waterfalls_html(runs: list[RunSummary]) -> str:
    count = max((len(run.turns) for run in runs), default=0)
    drawn = min(count, MAX_HTML_WATERFALLS)
    parts = ['<section class="waterfalls"><h2>Waterfalls</h2>']
    if len(runs) > 1:
        names = "; ".join(f"({k + 1}) {_e(run.label)}" for k, run in enumerate(runs))
        parts.append(f'<p class="muted">Turns side by side by their position in each run: {names}.</p>')
    if count > drawn:
        parts.append(f'<p class="muted">The first {drawn} of {count} turns are drawn.</p>')
    for index in range(drawn):
        present = [
            RunTurn(str(k + 1), run.label, run.turns[index])
            for k, run in enumerate(runs)
            if index < len(run.turns)
        ]
        numbered = len(runs) > 1
        caption = "<br>".join(
            _e((f"({entry.tag}) " if numbered else "") + _turn_title(entry.turn)) for entry in present
        )
        entries = [entry for entry in present if entry.turn.spans]
        if not entries:
            parts.append(
                f"<figure><figcaption>Turn {index + 1}: {caption} (nothing to draw)</figcaption></figure>"
            )
            continue
        svg = svg_of(waterfall_figure(entries, f"Turn {index + 1}"))
        parts.append(f'<figure id="turn-{index + 1}"><figcaption>{caption}</figcaption>{svg}</figure>')
    parts.append("</section>")
    return "\n".join(parts)


# ----- text helpers ------------------------------------------------------------------------------


def _turn_title(turn: TurnTiming) -> str:
    v2v = turn.stages.get("voice_to_voice")
    said = f"“{_short(turn.transcript, 70)}”" if turn.transcript else "(no transcript)"
    timing = f"voice-to-voice {v2v:.0f} ms" if v2v is not None else "no voice-to-voice"
    kind = "typed, " if turn.typed else ""
    return f"session {turn.session} turn {turn.turn} ({kind}{turn.outcome}): {said}, {timing}"


def _plain(text: str) -> str:
    """Text for matplotlib: `$` would start mathtext."""
    return text.replace("$", r"\$")


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
