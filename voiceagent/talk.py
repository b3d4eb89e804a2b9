"""`voiceagent talk IN.wav`: play a recording through the whole pipeline as if it were spoken live.

The file is cut into 20 ms frames and pushed at real-time pace, followed by silence so the endpointer
can hear the end. A simulated transport plays the agent's audio at real-time pace too and reports what
was played, as the WebSocket and phone transports do. With `fast` the clock jumps over the waits instead
(`FastForwardClock`) and input pauses while the agent answers, so the first-audio latencies stay true
(later playback times do not). The result holds the transcript, the reply, the reply audio and each
turn's latencies, taken from the trace as it is written (voiceagent/traced.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voiceagent.audio import FRAME_MS, FRAME_SAMPLES, frames
from voiceagent.clock import Clock, FastForwardClock, MonotonicClock
from voiceagent.events import Event, SpeechAudio, TranscriptFinal, TurnEnded, TurnError
from voiceagent.pipeline import Pipeline
from voiceagent.session import Session, SessionOptions
from voiceagent.traced import traced_session

TRAILING_SILENCE_S = 1.5  # at least: longer where the turn-taking policy may wait longer (trailing_silence_s)


@dataclass
class TalkResult:
    transcript: str = ""
    reply: str = ""
    reply_audio: list[np.ndarray] = field(default_factory=list)
    output_rate: int = 16000
    turns: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    preemptive: bool = False  # the first turn's reply was started on the pause partial and kept

    def summary(self) -> dict[str, Any]:
        first = self.turns[0] if self.turns else {}
        return {
            "transcript": self.transcript,
            "reply": self.reply,
            "latency_ms": first.get("latency_ms", {}),
            "turns": self.turns,
            "errors": self.errors,
        }


class _Transport:
    """Plays the agent's audio in real time (instantly when `fast`) and reports it back to the session."""

    def __init__(self, session: Session, clock: Clock, fast: bool, result: TalkResult) -> None:
        self.session, self.clock, self.fast, self.result = session, clock, fast, result
        self.played: dict[int, int] = {}

    async def run(self) -> None:
        async for event in self.session.events():
            await self._handle(event)

    async def _handle(self, event: Event) -> None:
        if isinstance(event, TranscriptFinal) and event.text:
            self.result.transcript = " ".join(filter(None, [self.result.transcript, event.text]))
        elif isinstance(event, SpeechAudio):
            self.session.audio_sent(event)
            self.result.reply_audio.append(event.samples)
            await self.clock.sleep(len(event.samples) / event.sample_rate)  # playing it
            self.played[event.turn_id] = self.played.get(event.turn_id, 0) + len(event.samples)
            self.session.audio_played(event.turn_id, self.played[event.turn_id])
        elif isinstance(event, TurnEnded):
            self.result.reply = " ".join(filter(None, [self.result.reply, event.spoken_text]))
        elif isinstance(event, TurnError):
            self.result.errors.append(f"{event.stage}: {event.message}")


async def talk(
    audio: np.ndarray,
    pipeline: Pipeline,
    *,
    trace_path: Path | None = None,
    fast: bool = False,
    clock: Clock | None = None,
    options: SessionOptions | None = None,
    record_audio: bool = False,
    speed: float = 1.0,
) -> TalkResult:
    """Plays `audio` (mono int16, 16 kHz) through a new session on `pipeline`, as if spoken live (`speed`
    times real time); returns what was heard and said, with the latencies of each turn. `record_audio`
    keeps the input audio beside the trace (voiceagent/recording.py)."""
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    await pipeline.warm_up()
    clock = clock or (FastForwardClock() if fast else MonotonicClock())
    opened = traced_session(
        pipeline, "talk", clock, options, trace_path=trace_path, record_audio=record_audio
    )
    async with opened as traced:
        session = traced.session
        result = TalkResult(output_rate=session.options.output_rate)
        transport = _Transport(session, clock, fast, result)
        playing = asyncio.create_task(transport.run())
        try:
            await _push_recording(session, clock, audio, fast, speed)
        finally:
            await session.close()  # ends the transport's events: it plays what it has, then stops
            await playing
    times = traced.times
    result.preemptive = times.any_preemptive()
    result.turns = [{"turn": t, "latency_ms": times.latencies_ms(t)} for t in times.turns_with_words()]
    return result


def trailing_silence_s(options: SessionOptions) -> float:
    """The silence pushed after a recording: enough for the longest wait the end of turn may take (a
    microphone would go on sending silence; a file ends), or the session would never hear the end."""
    policy = options.turn_taking
    longest_ms = max(policy.incomplete_silence_ms, policy.pending_silence_ms) if policy is not None else 0
    return max(TRAILING_SILENCE_S, longest_ms / 1000 + 0.5)


async def _push_recording(
    session: Session, clock: Clock, audio: np.ndarray, fast: bool, speed: float
) -> None:
    """Pushes `audio` and the trailing silence a frame at a time, at `speed` times real time, and waits
    until the agent has answered and been heard."""
    silence = np.zeros(int(trailing_silence_s(session.options) * 1000 / FRAME_MS) * FRAME_SAMPLES, np.int16)
    start_ns = clock.now_ns()
    for k, frame in enumerate(frames(np.concatenate([audio, silence]))):
        await session.push_audio(frame)
        if fast:
            await clock.sleep(FRAME_MS / 1000)
        else:  # on a schedule: time spent pushing a frame does not slow the pace down
            due_ns = start_ns + (k + 1) * FRAME_MS * 1_000_000 / speed
            await clock.sleep(max(0.0, (due_ns - clock.now_ns()) / 1e9))
        if fast and session.replying:
            # Fast-forwarding while the agent works would add the skipped time to its latencies:
            # take the turns one at a time instead.
            await session.wait_idle()
    await session.wait_idle()
