"""Real recorded speech through whole voice sessions: how soon the final transcript follows the endpoint.

    .venv/bin/python -m bench.asr_session [--clips jfk,librivox-0870,...] [--out bench/results/FILE.md]

bench/asr_real streams the real clips into the recognisers under the endpointer's fixed 320 ms silence (the
session's rule without a score), so its final often has to wait for a partial still running. A session with
the bundled pair ends the turn on the end-of-turn score of the partial at the pause instead
(voiceagent/endpointing.py), and the final can reuse that very partial. This bench plays each clip of
voiceagent/real_speech.py through `voiceagent talk` (one loaded Pipeline with the default settings, a fresh
session a clip, real time: VAD, streaming ASR, score, reply, TTS) and reads the trace: per utterance, the
time from the endpoint's decision (vad.speech_end's confirmed_ns) to asr.final; per clip, the WER of its
finals joined. A clip the endpointer splits is answered after each part (the later parts may be heard over
the agent's reply, by the barge-in recogniser).

Progress goes to stderr; the LAST line on stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.asr_real_report import machine
from voiceagent.config import Settings
from voiceagent.real_speech import CLIPS, RealClip, load_clips
from voiceagent.wer import normalized_words, word_error_rate

LEAD_S = 0.5


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def finals_after_decision(records: list[dict[str, Any]]) -> tuple[list[str], list[float]]:
    """A trace's final transcripts and, for each, ms from its turn's speech_end confirmation to it."""
    confirmed = {r["turn"]: r["confirmed_ns"] for r in records if r["event"] == "vad.speech_end"}
    finals = [r for r in records if r["event"] == "asr.final" and not r.get("typed")]
    delays = [(r["t_ns"] - confirmed[r["turn"]]) / 1e6 for r in finals if r["turn"] in confirmed]
    return [r["text"] for r in finals], delays


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 1)


async def run_clips(clips: list[RealClip]) -> list[dict[str, Any]]:
    from voiceagent.pipeline import Pipeline
    from voiceagent.talk import talk

    pipeline = Pipeline.load(Settings(), log)
    await pipeline.warm_up()
    rows = []
    with tempfile.TemporaryDirectory(prefix="asr-session-") as scratch:
        for clip in clips:
            trace = Path(scratch) / f"{clip.name}.jsonl"
            audio = np.concatenate([np.zeros(int(LEAD_S * 16000), dtype=np.int16), clip.audio])
            await talk(audio, pipeline, trace_path=trace)
            records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
            finals, delays = finals_after_decision(records)
            heard = " ".join(finals)
            row = {"clip": clip.name, "text": clip.text, "heard": heard, "delays_ms": delays}
            row.update(wer=word_error_rate(clip.text, heard), words=len(normalized_words(clip.text)))
            rows.append(row)
            log(
                f"{clip.name}: wer {row['wer']:.2f}, final after the decision {[round(d) for d in delays]} ms"
            )
    return rows


def summary(rows: list[dict[str, Any]], settings: Settings) -> dict[str, Any]:
    delays = [d for row in rows for d in row["delays_ms"]]
    errors = sum(row["wer"] * row["words"] for row in rows)
    return {
        "asr": settings.asr_model,
        "clips": len(rows),
        "utterances": len(delays),
        "wer": round(errors / max(1, sum(row["words"] for row in rows)), 4),
        "final_after_decision_ms": {"p50": percentile(delays, 0.5), "p95": percentile(delays, 0.95)}
        if delays
        else None,
        "reused_within_50_ms": sum(1 for d in delays if d <= 50),
        "machine": machine(),
        "rows": rows,
    }


def page(result: dict[str, Any], command: str) -> str:
    figures = result["final_after_decision_ms"] or {"p50": None, "p95": None}
    lines = [
        "# Real speech through whole voice sessions: the final after the endpoint's decision",
        "",
        f"Command: `{command}`. Machine: {json.dumps(result['machine'])}.",
        "",
        f"Recogniser `{result['asr']}`, {result['clips']} clips, {result['utterances']} utterances: final "
        f"transcript p50 {figures['p50']} ms / p95 {figures['p95']} ms after the endpoint's decision; "
        f"{result['reused_within_50_ms']} of {result['utterances']} within 50 ms; WER of the finals "
        f"{result['wer']}.",
        "",
        "| clip | WER | final after the decision (ms) | heard |",
        "|---|---|---|---|",
    ]
    for row in result["rows"]:
        delays = ", ".join(f"{d:.0f}" for d in row["delays_ms"])
        lines.append(f"| {row['clip']} | {row['wer']:.2f} | {delays} | {row['heard']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clips", default=",".join(CLIPS))
    parser.add_argument("--out", type=Path, default=None, help="write the results page (markdown) here")
    args = parser.parse_args(argv)
    clips = load_clips(tuple(c for c in args.clips.split(",") if c), log)
    settings = Settings()
    result = summary(asyncio.run(run_clips(clips)), settings)
    if args.out is not None:
        args.out.write_text(page(result, "python -m bench.asr_session " + " ".join(argv or sys.argv[1:])))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
