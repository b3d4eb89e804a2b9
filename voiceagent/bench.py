"""`voiceagent bench`: voice-to-voice latency over a set of spoken questions, with p50/p95 per stage.

Each question of `bench/voice_questions.txt` is spoken by one of several voices (the bundled Piper voice and
espeak-ng accents, in turn), padded with silence, and played through a fresh session of ONE loaded pipeline
at real-time pace, exactly as `voiceagent talk IN.wav` does. Every latency is measured from the end of the
user's speech (vad.speech_end's time: the end of the last voiced frame), so the silence the endpointer waits
for is counted in. The process's peak resident memory is reported too: every default model is loaded in it.
`--noise-dbfs` puts pink noise at that RMS level under every clip (`audio.with_noise_floor`): generated speech
otherwise ends in digital silence, where Silero drops at once, and a real line never does.

The table goes to stderr; the LAST line on stdout is one JSON object (`voice_to_voice` etc. with p50/p95/max).
"""

from __future__ import annotations

import asyncio
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voiceagent.audio import SAMPLE_RATE, read_wav, resample, with_noise_floor
from voiceagent.config import Settings
from voiceagent.replay.stats import latency_summary
from voiceagent.wer import word_error_rate

DEFAULT_QUESTIONS = Path("bench/voice_questions.txt")
VOICES = ("piper", "espeak:en-us", "espeak:en-gb-x-rp")
LEADING_SILENCE_S = 1.0
STAGES = ("asr_final", "first_block", "tts_first_audio", "voice_to_voice")

Log = Callable[[str], None]


@dataclass
class ClipResult:
    voice: str
    question: str
    transcript: str = ""
    reply: str = ""
    word_error_rate: float = 0.0
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    preemptive: bool | None = None  # the reply was started on the pause partial and kept
    errors: list[str] = field(default_factory=list)


def speak_question(text: str, voice: str, directory: Path, piper: Any) -> np.ndarray:
    """`text` spoken by `voice` ("piper" or "espeak:VOICE") -> [n] int16 PCM16 mono 16 kHz, silence-padded."""
    if voice == "piper":
        chunks = list(piper.synthesize(text))
        speech = resample(np.concatenate(chunks), piper.sample_rate, SAMPLE_RATE)
    elif voice.startswith("espeak:"):
        path = directory / f"{abs(hash((text, voice)))}.wav"
        subprocess.run(["espeak-ng", "-v", voice.split(":", 1)[1], "-w", str(path), text], check=True)
        speech = read_wav(path)
    else:
        raise ValueError(f"unknown voice {voice!r}: 'piper' or 'espeak:NAME'")
    lead = np.zeros(int(LEADING_SILENCE_S * SAMPLE_RATE), dtype=np.int16)
    return np.concatenate([lead, speech.astype(np.int16)])


async def run_clips(
    questions: Sequence[str],
    voices: Sequence[str],
    settings: Settings,
    log: Log,
    traces: Path | None = None,
    noise_dbfs: float | None = None,
) -> tuple[list[ClipResult], float]:
    """Loads the pipeline once, then plays every question through a fresh session (over a noise floor at
    `noise_dbfs`, if given); returns the results and the seconds the models took to load and warm up."""
    from voiceagent.pipeline import Pipeline  # heavy imports
    from voiceagent.talk import talk
    from voiceagent.tts import load_synthesizer

    started = time.perf_counter()
    pipeline = Pipeline.load(settings, log)
    await pipeline.warm_up()
    load_s = time.perf_counter() - started
    piper = load_synthesizer("piper") if "piper" in voices else None
    results: list[ClipResult] = []
    with tempfile.TemporaryDirectory(prefix="voice-bench-") as scratch:
        for i, question in enumerate(questions):
            voice = voices[i % len(voices)]
            audio = speak_question(question, voice, Path(scratch), piper)
            if noise_dbfs is not None:
                audio = with_noise_floor(audio, noise_dbfs, seed=i)
            trace_path = (traces or Path(scratch)) / f"trace-{i:02d}.jsonl"
            trace_path.unlink(missing_ok=True)
            outcome = await talk(audio, pipeline, trace_path=trace_path)
            result = ClipResult(voice, question, outcome.transcript, outcome.reply, errors=outcome.errors)
            result.word_error_rate = round(word_error_rate(question, outcome.transcript), 3)
            result.latency_ms = dict(outcome.summary()["latency_ms"])
            result.preemptive = outcome.preemptive
            results.append(result)
            log(_row(i, result))
    return results, load_s


def _row(i: int, r: ClipResult) -> str:
    figures = " ".join(f"{(r.latency_ms.get(stage) or float('nan')):7.0f}" for stage in STAGES)
    return f"{i:2d} {r.voice:18} {figures}  wer={r.word_error_rate:.2f}  {r.transcript!r} -> {r.reply[:60]!r}"


def summarize(results: Sequence[ClipResult], settings: Settings, load_s: float) -> dict[str, Any]:
    summary: dict[str, Any] = {
        stage: latency_summary([v for r in results if (v := r.latency_ms.get(stage)) is not None])
        for stage in STAGES
    }
    summary.update(
        clips=len(results),
        errors=sum(len(r.errors) for r in results),
        mean_word_error_rate=round(float(np.mean([r.word_error_rate for r in results])), 3)
        if results
        else None,
        preemptive_kept=sum(1 for r in results if r.preemptive),
        end_silence_ms=settings.end_silence_ms,
        models={
            "target": settings.target,
            "draft": settings.draft,
            "draft_quant": settings.draft_quant,
            "backend": settings.backend,
            "gamma": settings.gamma,
            "asr": settings.asr_model,
            "tts": settings.tts,
        },
        load_and_warm_s=round(load_s, 1),
        peak_rss_gib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        machine=f"{platform.machine()}, {_cpu_count()} CPUs, Python {platform.python_version()}",
        clips_detail=[asdict(r) for r in results],
    )
    return summary


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main(
    questions_path: Path,
    limit: int | None,
    settings: Settings,
    traces: Path | None = None,
    noise_dbfs: float | None = None,
) -> int:
    log: Log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    if not questions_path.is_file():
        raise ValueError(f"{questions_path} does not exist (one question per line)")
    questions = [line.strip() for line in questions_path.read_text().splitlines() if line.strip()]
    questions = questions[:limit] if limit else questions
    noise = "" if noise_dbfs is None else f", over pink noise at {noise_dbfs:g} dBFS"
    log(f"{len(questions)} questions, voices {', '.join(VOICES)}, played in real time{noise}")
    log(
        "  # voice              "
        + " ".join(f"{stage[:7]:>7}" for stage in STAGES)
        + "  (ms after speech end)"
    )
    if traces is not None:
        traces.mkdir(parents=True, exist_ok=True)
    results, load_s = asyncio.run(run_clips(questions, VOICES, settings, log, traces, noise_dbfs))
    summary = summarize(results, settings, load_s)
    summary["noise_dbfs"] = noise_dbfs
    for stage in STAGES:
        figures = summary[stage]
        log(f"{stage:16} p50 {figures['p50']} ms  p95 {figures['p95']} ms  max {figures['max']} ms")
    log(f"peak RSS {summary['peak_rss_gib']} GiB; mean WER {summary['mean_word_error_rate']}")
    print(json.dumps(summary))
    return 0 if summary["errors"] == 0 else 1
