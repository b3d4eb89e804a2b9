"""Voice to voice with each ASR model, side by side: does a model that hears better cost the reply time?

    .venv/bin/python -m bench.asr_voice [--models tiny.en,base] [--limit 8]

One pipeline (the default LLM pair, Silero, Piper) is loaded once with every model's recogniser; each
question of bench/voice_questions.txt, spoken as `voiceagent bench` speaks it, is played through a fresh
session once per model, back to back, so that load from elsewhere falls on every model alike. Per model:
WER of the transcript, and p50/p95 of asr_final, first_block and voice_to_voice (ms after the end of
speech), as `voiceagent bench` measures them.

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

from voiceagent.bench import DEFAULT_QUESTIONS, VOICES, speak_question
from voiceagent.config import Settings
from voiceagent.recognizers import load_asr_model
from voiceagent.wer import word_error_rate

STAGES = ("asr_final", "first_block", "voice_to_voice")


async def run(models: list[str], questions: list[str]) -> dict[str, Any]:
    from voiceagent.pipeline import Pipeline  # heavy imports
    from voiceagent.talk import talk
    from voiceagent.tts import load_synthesizer

    pipeline = Pipeline.load(Settings(asr_model=models[0]), log=lambda m: print(m, file=sys.stderr))
    await pipeline.warm_up()
    for model in models:
        load_asr_model(model)
    piper = load_synthesizer("piper")
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in models}
    with tempfile.TemporaryDirectory(prefix="asr-voice-") as scratch:
        for i, question in enumerate(questions):
            audio = speak_question(question, VOICES[i % len(VOICES)], Path(scratch), piper)
            for model in models:
                pipeline.settings = Settings(asr_model=model)  # new sessions take this model's recogniser
                outcome = await talk(audio, pipeline)
                latency = outcome.summary()["latency_ms"]
                wer = word_error_rate(question, outcome.transcript)
                rows[model].append({"wer": wer, **{s: latency.get(s) for s in STAGES}})
                print(f"{i} {model}: {wer:.2f} {outcome.transcript!r} {latency}", file=sys.stderr, flush=True)
    return {m: summarise(r) for m, r in rows.items()}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"mean_wer": round(float(np.mean([r["wer"] for r in rows])), 3)}
    for stage in STAGES:
        values = [r[stage] for r in rows if r[stage] is not None]
        out[stage] = {p: round(float(np.percentile(values, q)), 1) for p, q in (("p50", 50), ("p95", 95))}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="tiny.en,base")
    parser.add_argument("--limit", type=int, default=8)
    args = parser.parse_args(argv)
    questions = [q.strip() for q in DEFAULT_QUESTIONS.read_text().splitlines() if q.strip()][: args.limit]
    print(
        json.dumps(
            {"questions": len(questions), "results": asyncio.run(run(args.models.split(","), questions))}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
