"""The replay report: one self-contained HTML file (and, re-exported here, the PNG waterfall for a README).

The HTML needs nothing else to open: inline CSS, no script, and every picture an inline SVG drawn by
matplotlib (voiceagent/replay/waterfall.py). It holds the comparison (regressed stages highlighted) when
there is one, a summary table per run (p50/p95/max per stage, speculative figures), a table of every turn,
and a waterfall picture per turn position, with the runs side by side. Every string from a trace is
escaped with html.escape.
"""

from __future__ import annotations

import html
from pathlib import Path

from voiceagent.replay.analysis import STAGE_TITLES, STAGES, RunSummary
from voiceagent.replay.compare import Comparison
from voiceagent.replay.waterfall import RunTurn, svg_of, turn_title, waterfall_figure, write_png

__all__ = ["TITLE", "render_html", "write_html", "write_png"]

TITLE = "Voice agent replay report"
MAX_HTML_WATERFALLS = 40  # pictures in one report (each is tens of kB of SVG, about 0.3 s to draw)


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
            _e((f"({entry.tag}) " if numbered else "") + turn_title(entry.turn)) for entry in present
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
