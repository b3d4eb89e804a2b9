"""Our side: one loaded Pipeline, each clip played through a fresh session by `voiceagent.talk.talk`, exactly
as `voiceagent bench` plays it; the times come from the session's trace.

The trace's session.start is written just before the first frame is pushed (talk starts its schedule right
after opening the session), so it stands for t0; frames are stamped with their push time, so our VAD's
vad.speech_end can be set beside the audio's own speech end. Stages: turn_end = vad.speech_end's
confirmed_ns (the endpointer decided the turn was over), transcript = asr.final, first_text =
llm.first_block, tts_first_audio = tts.first_audio, voice_to_voice = out.first_audio.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.voice_vs_pipecat.timeline import SystemRun, after_speech_ms
from voiceagent.config import Settings
from voiceagent.trace import (
    ASR_FINAL,
    LLM_FIRST_BLOCK,
    OUT_FIRST_AUDIO,
    SESSION_START,
    TTS_FIRST_AUDIO,
    VAD_SPEECH_END,
)
from voiceagent.wer import word_error_rate

Log = Callable[[str], None]
EVENTS = {
    "transcript": ASR_FINAL,
    "first_text": LLM_FIRST_BLOCK,
    "tts_first_audio": TTS_FIRST_AUDIO,
    "voice_to_voice": OUT_FIRST_AUDIO,
}


def turn_times_ns(records: list[dict[str, Any]], turn: int) -> tuple[int, dict[str, int | None]]:
    """A trace's records -> (t0 ns, each stage's first ns in `turn`, plus vad_speech_end)."""
    start = next((r["t_ns"] for r in records if r["event"] == SESSION_START), None)
    if start is None:
        raise ValueError("the trace has no session.start record")
    first: dict[str, dict[str, Any]] = {}
    for record in records:
        if record["turn"] == turn:
            first.setdefault(record["event"], record)
    end = first.get(VAD_SPEECH_END)
    times: dict[str, int | None] = {
        "turn_end": end.get("confirmed_ns") if end else None,
        "vad_speech_end": end["t_ns"] if end else None,
    }
    times.update({stage: first[event]["t_ns"] if event in first else None for stage, event in EVENTS.items()})
    return int(start), times


def read_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class OurSide:
    """The pipeline loaded once (every default model, as `voiceagent bench` loads them) and warmed up."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    @classmethod
    async def load(cls, settings: Settings, log: Log) -> OurSide:
        from voiceagent.pipeline import Pipeline  # heavy imports

        pipeline = Pipeline.load(settings, log)
        await pipeline.warm_up()
        return cls(pipeline)

    async def run(self, audio: np.ndarray, question: str, end_s: float, trace_path: Path) -> SystemRun:
        """Plays `audio` through a new session, tracing to `trace_path` (a new file)."""
        from voiceagent.talk import talk

        outcome = await talk(audio, self.pipeline, trace_path=trace_path)
        run = SystemRun(outcome.transcript, outcome.reply, errors=list(outcome.errors))
        run.word_error_rate = round(word_error_rate(question, outcome.transcript), 3)
        if not outcome.turns:
            run.errors.append("no turn with words")
            return run
        t0, times = turn_times_ns(read_trace(trace_path), int(outcome.turns[0]["turn"]))
        run.latency_ms = after_speech_ms(times, t0, end_s)
        if run.latency_ms.get("voice_to_voice") is None:
            run.errors.append("no audio out")
        return run
