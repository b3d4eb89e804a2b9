"""`voiceagent replay TRACE.jsonl`: re-drive a recorded session, report where every millisecond went.

With recorded audio (VOICEAGENT_RECORD_AUDIO / `talk --record-audio`) each session is played again at its
recorded pace `--against` the pipeline in this process (`local`), a live server's `ws://HOST:PORT/ws` or a
phone endpoint `ws://HOST:PORT/twilio`, into a new trace (`--out`); the report puts the recorded run and the
replay side by side. Without recorded audio (or with `--analyze-only`) it analyses the trace alone.
`--compare OTHER.jsonl` takes OTHER as the baseline: a stage whose p50 regressed beyond the thresholds makes
the exit code 2, so a replay can gate CI. The last line with `--json` is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from websockets.exceptions import WebSocketException

from voiceagent.replay.analysis import RunSummary, summarize
from voiceagent.replay.chrome import chrome_trace
from voiceagent.replay.compare import Comparison, compare
from voiceagent.replay.recordings import Recording, recordings
from voiceagent.replay.traces import read_trace

if TYPE_CHECKING:
    from voiceagent.replay.drive import DriveResult

REGRESSED = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace", type=Path, help="a JSONL session trace (voiceagent talk --trace, or the server's)"
    )
    parser.add_argument(
        "--against",
        default="local",
        help="'local' (this process), ws://HOST:PORT/ws or ws://HOST:PORT/twilio",
    )
    parser.add_argument(
        "--speed", type=float, default=1.0, help="pace of the replayed audio (1.0: as recorded)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the replay's trace (default: TRACE.replay.jsonl)"
    )
    parser.add_argument("--analyze-only", action="store_true", help="report the trace without re-driving it")
    parser.add_argument(
        "--compare", type=Path, default=None, help="a baseline trace: exit 2 if a p50 regressed"
    )
    parser.add_argument(
        "--threshold-ms", type=float, default=50.0, help="a regression grows p50 by more than this"
    )
    parser.add_argument(
        "--threshold-pct", type=float, default=10.0, help="... and by more than this percentage"
    )
    parser.add_argument("--report", type=Path, default=None, help="write one self-contained HTML report here")
    parser.add_argument("--png", type=Path, default=None, help="write the last run's waterfall picture here")
    parser.add_argument("--chrome-trace", type=Path, default=None, help="Chrome trace-event JSON (Perfetto)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the numbers")
    parser.add_argument(
        "--llm", default=None, help="local: 'local' or an OpenAI-compatible URL (VOICEAGENT_LLM)"
    )
    parser.add_argument("--target", default=None, help="local: the target model (VOICEAGENT_TARGET)")
    parser.add_argument("--draft", default=None, help="local: the draft model or 'none' (VOICEAGENT_DRAFT)")


def run(args: argparse.Namespace, settings_for: Any) -> int:
    """The command; `settings_for(args)` builds the voiceagent Settings for a local replay."""
    if args.speed <= 0:
        raise ValueError(f"--speed must be > 0, got {args.speed}")
    _check_against(args.against)
    original = read_trace(args.trace)
    runs = [summarize(original, label=f"recorded: {args.trace.name}")]
    traces = {runs[0].label: original.records}
    sessions = [] if args.analyze_only else recordings(original.records, args.trace)
    drives: list[DriveResult] = []
    if sessions:
        out = args.out or args.trace.with_name(args.trace.stem + ".replay.jsonl")
        if out.resolve() == args.trace.resolve():
            raise ValueError("--out must not be the trace being replayed")
        out.unlink(missing_ok=True)
        try:
            drives = asyncio.run(_drive(sessions, args, out, settings_for))
        except (WebSocketException, RuntimeError) as error:  # refused, closed, bad handshake
            raise ValueError(f"the replay against {args.against} failed: {error}") from error
        replayed = read_trace(out)
        runs.append(summarize(replayed, label=f"replay ({_where(args.against)}): {out.name}"))
        traces[runs[-1].label] = replayed.records
    elif not args.analyze_only:
        _say("no recorded audio in the trace: analysing it alone (record with VOICEAGENT_RECORD_AUDIO=1)")
    comparison = _comparison(args, runs, traces)
    _print_tables(runs, comparison, drives)
    _write_outputs(args, runs, comparison, traces)
    if args.json:
        print(json.dumps(_numbers(runs, comparison, drives)))
    return REGRESSED if args.compare is not None and comparison is not None and comparison.regressed else 0


def _check_against(against: str) -> None:
    if against == "local":
        return
    parts = urlsplit(against)
    if parts.scheme not in ("ws", "wss") or parts.path.rstrip("/") not in ("/ws", "/twilio"):
        raise ValueError(
            f"--against must be 'local', ws://HOST:PORT/ws or ws://HOST:PORT/twilio, got {against!r}"
        )


def _where(against: str) -> str:
    return "in-process" if against == "local" else against


async def _drive(
    sessions: list[Recording], args: argparse.Namespace, out: Path, settings_for: Any
) -> list[DriveResult]:
    from voiceagent.replay.drive import replay_local, replay_twilio, replay_ws  # loads torch (via talk)

    pipeline = None
    if args.against == "local":
        from voiceagent.pipeline import Pipeline  # heavy: loads the models

        pipeline = Pipeline.load(settings_for(args), log=_say)
    results = []
    for i, recording in enumerate(sessions, 1):
        _say(
            f"replaying session {recording.session} ({i}/{len(sessions)}, {recording.seconds:.1f} s of audio)"
        )
        for problem in recording.problems:
            _say(f"warning: {problem}")
        if pipeline is not None:
            results.append(await replay_local(recording, pipeline, out, args.speed))
        elif urlsplit(args.against).path.rstrip("/") == "/twilio":
            results.append(await replay_twilio(recording, args.against, out, args.speed))
        else:
            key = os.environ.get("VOICEAGENT_API_KEY")
            results.append(await replay_ws(recording, args.against, out, args.speed, api_key=key))
    return results


def _comparison(
    args: argparse.Namespace, runs: list[RunSummary], traces: dict[str, list[dict[str, Any]]]
) -> Comparison | None:
    thresholds = {"threshold_ms": args.threshold_ms, "threshold_pct": args.threshold_pct}
    if args.compare is not None:
        baseline_trace = read_trace(args.compare)
        baseline = summarize(baseline_trace, label=f"baseline: {args.compare.name}")
        traces[baseline.label] = baseline_trace.records
        runs.insert(0, baseline)
        return compare(baseline, runs[-1], **thresholds)
    if len(runs) == 2:
        return compare(runs[0], runs[1], **thresholds)
    return None


def _print_tables(runs: list[RunSummary], comparison: Comparison | None, drives: list[DriveResult]) -> None:
    for summary in runs:
        _say(summary.text_table())
        for problem in summary.problems:
            _say(f"  skipped: {problem}")
    for drive in drives:
        _say(f"replayed {drive.session}: heard {drive.transcript!r}; said {drive.reply!r}")
        for error in drive.errors:
            _say(f"  error: {error}")
    if comparison is not None:
        _say(comparison.text_table())


def _write_outputs(
    args: argparse.Namespace,
    runs: list[RunSummary],
    comparison: Comparison | None,
    traces: dict[str, list[dict[str, Any]]],
) -> None:
    from voiceagent.replay.report import write_html, write_png  # matplotlib: only when drawing

    if args.report is not None:
        write_html(args.report, runs, comparison)
        _say(f"report: {args.report}")
    if args.png is not None:
        write_png(args.png, runs[-1])
        _say(f"waterfall: {args.png}")
    if args.chrome_trace is not None:
        args.chrome_trace.parent.mkdir(parents=True, exist_ok=True)
        args.chrome_trace.write_text(json.dumps(chrome_trace(runs)))
        _say(f"chrome trace: {args.chrome_trace} (open in https://ui.perfetto.dev)")


def _numbers(
    runs: list[RunSummary], comparison: Comparison | None, drives: list[DriveResult]
) -> dict[str, Any]:
    return {
        "runs": [summary.to_json() for summary in runs],
        "comparison": None if comparison is None else comparison.to_json(),
        "replayed": [
            {"session": d.session, "transcript": d.transcript, "reply": d.reply, "errors": d.errors}
            for d in drives
        ],
    }


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
