"""Re-drives a recorded session at its recorded pace and writes a new trace of what happened.

Three ways, one per kind of deployment:
- `replay_local`: the pipeline in this process (`voiceagent.talk`): the new trace is the session's own.
- `replay_ws`: a live `voiceagent serve` through its `/ws` API (docs/protocol.md). The client writes the trace
  from the events it receives, on its own clock: `vad.speech_end` at the event's arrival less its `waited_ms`
  (so the end of speech, as the server's trace has it), `out.first_audio` when the first audio frame
  arrives. So voice-to-voice includes the network both ways. `tts.first_audio` is placed from the server's
  `turn.metrics` (`source: "server"`): the client cannot see it.
- `replay_twilio`: a Twilio Media Streams endpoint (`/twilio`), as a phone would: mu-law media at real pace,
  marks returned when their audio would have played. Twilio says nothing of transcripts or VAD, so the
  trace holds the recorded ends of speech (moved to the replay's timeline) and the first agent audio after
  each: voice-to-voice only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from voiceagent.audio import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, mulaw_encode, resample
from voiceagent.clock import Clock, MonotonicClock
from voiceagent.replay.recordings import Recording
from voiceagent.session_options import SessionOptions
from voiceagent.talk import trailing_silence_s
from voiceagent.trace import (
    ASR_FINAL,
    ASR_PARTIAL,
    LLM_BLOCK,
    LLM_FIRST_BLOCK,
    OUT_FIRST_AUDIO,
    OUT_PLAYED,
    SESSION_END,
    SESSION_START,
    TTS_FIRST_AUDIO,
    TURN_END,
    TURN_ERROR,
    TURN_INTERRUPTED,
    VAD_SPEECH_END,
    VAD_SPEECH_START,
    Trace,
)

PHONE_RATE = 8000
QUIET_S = (
    1.5  # after the audio, the session is done once every answered turn ended and this long passed quietly
)
DONE_TIMEOUT_S = 120.0  # at most this long after the audio for the replies to finish


@dataclass
class DriveResult:
    """What one replayed session heard and said (empty where the far end does not say)."""

    session: str
    transcript: str = ""
    reply: str = ""
    errors: list[str] = field(default_factory=list)


def with_trailing_silence(audio: np.ndarray) -> np.ndarray:
    seconds = trailing_silence_s(SessionOptions())  # the far end's default turn-taking may wait this long
    return np.concatenate([audio, np.zeros(int(seconds * SAMPLE_RATE), dtype=np.int16)])


async def replay_local(recording: Recording, pipeline: Any, out: Path, speed: float) -> DriveResult:
    """The recording through `pipeline` (a voiceagent.pipeline.Pipeline) in this process."""
    from voiceagent.talk import talk

    result = await talk(recording.audio, pipeline, trace_path=out, speed=speed)
    return DriveResult(recording.session, result.transcript, result.reply, result.errors)


async def paced_send(
    audio: np.ndarray, step: int, rate: int, speed: float, send: Callable[[np.ndarray], Any]
) -> None:
    """Calls `send` with `step` samples at a time, on the schedule of `rate` samples per second x `speed`."""
    start = time.monotonic()
    for i, offset in enumerate(range(0, len(audio), step)):
        await send(audio[offset : offset + step])
        await asyncio.sleep(max(0.0, start + (i + 1) * step / rate / speed - time.monotonic()))


class _WsSession:
    """The /ws client side of one replayed session: sends audio, turns the server's events into a trace."""

    def __init__(self, ws: ClientConnection, out: Path, clock: Clock, result: DriveResult) -> None:
        self.ws, self.clock, self.result = ws, clock, result
        self.trace: Trace | None = None
        self.out = out
        self.pending: set[int] = set()  # turns with a final transcript and no turn.metrics yet
        self.audio_turn = 0
        self.first_audio: set[int] = set()
        self.speech_end_ns: dict[int, int] = {}
        self.replies: dict[int, str] = {}
        self.last_message_ns = clock.now_ns()

    def write(self, event: str, turn: int, **data: Any) -> None:
        if self.trace is not None:
            self.trace.write(event, turn, **data)

    async def start(self) -> None:
        await self.ws.send(
            json.dumps({"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": SAMPLE_RATE}})
        )
        while True:
            message = json.loads(await self.ws.recv())
            if message.get("type") == "session.started":
                break
            if message.get("type") == "error":
                raise RuntimeError(f"the server refused the session: {message.get('message')}")
        self.result.session = str(message.get("session_id", uuid.uuid4().hex[:12]))
        self.trace = Trace(self.out, self.result.session, self.clock)
        self.write(SESSION_START, 0, transport="ws-replay")

    async def read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in self.ws:
                self.last_message_ns = self.clock.now_ns()
                if isinstance(message, bytes):
                    self._on_audio()
                else:
                    self._on_event(json.loads(message))

    def _on_audio(self) -> None:
        turn = self.audio_turn
        if turn and turn not in self.first_audio:
            self.first_audio.add(turn)
            self.write(OUT_FIRST_AUDIO, turn)

    def _on_event(self, message: dict[str, Any]) -> None:
        kind, turn = message.get("type"), int(message.get("turn") or 0)
        now = self.clock.now_ns()
        if kind == "vad.speech_start":
            self.write(VAD_SPEECH_START, turn)
        elif kind == "vad.speech_end":
            end = now - int(float(message.get("waited_ms") or 0.0) * 1e6)
            self.speech_end_ns[turn] = end
            self.write(VAD_SPEECH_END, turn, t_ns=end, confirmed_ns=now)
        elif kind == "transcript.partial":
            self.write(ASR_PARTIAL, turn, text=message.get("text", ""), stable=message.get("stable", ""))
        elif kind == "transcript.final":
            text = str(message.get("text", ""))
            self.write(ASR_FINAL, turn, text=text)
            if text.strip():
                self.pending.add(turn)
                self.result.transcript = " ".join(filter(None, [self.result.transcript, text]))
        elif kind == "agent.block":
            counts = {k: message.get(k) for k in ("n_drafted", "n_accepted")}
            if message.get("first"):
                self.write(LLM_FIRST_BLOCK, turn, **counts)
            self.write(LLM_BLOCK, turn, text=message.get("text", ""), **counts)
            self.replies[turn] = self.replies.get(turn, "") + str(message.get("text", ""))
        elif kind == "agent.audio.start":
            self.audio_turn = turn
        elif kind == "agent.audio.end":
            self.write(
                OUT_PLAYED, turn, samples=message.get("samples"), interrupted=message.get("interrupted")
            )
        elif kind == "interrupted":
            self.write(TURN_INTERRUPTED, turn, spoken_text=message.get("spoken_text", ""))
        elif kind == "turn.metrics":
            self._on_metrics(turn, message)
        elif kind == "error":
            self.result.errors.append(f"{message.get('code')}: {message.get('message')}")
            self.write(
                TURN_ERROR, turn, stage=message.get("stage", "server"), message=message.get("message", "")
            )
            self.pending.discard(turn)

    def _on_metrics(self, turn: int, message: dict[str, Any]) -> None:
        latency = message.get("latency_ms") or {}
        tts_ms = latency.get("tts_first_audio")
        if turn in self.speech_end_ns and isinstance(tts_ms, int | float):
            t = self.speech_end_ns[turn] + int(tts_ms * 1e6)
            self.write(TTS_FIRST_AUDIO, turn, t_ns=t, source="server")
        reply = self.replies.get(turn, "").strip()
        self.write(
            TURN_END, turn, reason=message.get("outcome", "done"), reply=reply, server_latency_ms=latency
        )
        if message.get("outcome") == "done":
            self.result.reply = " ".join(filter(None, [self.result.reply, reply]))
        self.pending.discard(turn)

    def done(self) -> bool:
        quiet_ns = self.clock.now_ns() - self.last_message_ns
        return not self.pending and quiet_ns >= QUIET_S * 1e9

    def close(self) -> None:
        if self.trace is not None:
            self.write(SESSION_END, 0)
            self.trace.close()


async def replay_ws(
    recording: Recording,
    url: str,
    out: Path,
    speed: float,
    *,
    api_key: str | None = None,
    clock: Clock | None = None,
) -> DriveResult:
    """The recording through a live server's /ws API; the client's trace is appended to `out`."""
    result = DriveResult(recording.session)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with connect(url, additional_headers=headers, max_size=None) as ws:
        client = _WsSession(ws, out, clock or MonotonicClock(), result)
        try:
            await client.start()
            reading = asyncio.create_task(client.read())
            await paced_send(
                with_trailing_silence(recording.audio), FRAME_SAMPLES, SAMPLE_RATE, speed,
                lambda chunk: ws.send(chunk.astype("<i2").tobytes()),
            )  # fmt: skip
            await _wait_until(client.done, reading)
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps({"type": "session.end"}))
            await asyncio.wait_for(reading, 10)
        finally:
            client.close()
    return result


async def _wait_until(done: Callable[[], bool], reading: asyncio.Task[None]) -> None:
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while not done() and not reading.done():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the server did not finish its replies within {DONE_TIMEOUT_S:.0f} s of the audio"
            )
        await asyncio.sleep(0.05)


class _Phone:
    """The Twilio side of a replayed call: plays the agent's media in real time and returns its marks then."""

    def __init__(self, ws: ClientConnection, stream_sid: str, clock: Clock) -> None:
        self.ws, self.stream_sid, self.clock = ws, stream_sid, clock
        self.media_ns: list[int] = []  # arrival of each agent media message
        self.playing_until = 0.0  # time.monotonic() when the audio received so far ends
        self.marks: dict[str, asyncio.TimerHandle] = {}
        self.last_message_ns = clock.now_ns()
        self.sequence = 0

    async def send(self, event: str, body: dict[str, Any]) -> None:
        self.sequence += 1
        message = {
            "event": event,
            "sequenceNumber": str(self.sequence),
            "streamSid": self.stream_sid,
            event: body,
        }
        await self.ws.send(json.dumps(message))

    async def start(self) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        media_format = {"encoding": "audio/x-mulaw", "sampleRate": PHONE_RATE, "channels": 1}
        start = {"streamSid": self.stream_sid, "callSid": "CA" + self.stream_sid[2:], "tracks": ["inbound"]}
        await self.send("start", {**start, "mediaFormat": media_format, "customParameters": {}})

    async def say(self, audio_16k: np.ndarray, speed: float) -> None:
        audio = resample(audio_16k, SAMPLE_RATE, PHONE_RATE)
        chunk = PHONE_RATE * FRAME_MS // 1000

        async def media(samples: np.ndarray) -> None:
            payload = base64.b64encode(mulaw_encode(samples)).decode()
            await self.send("media", {"track": "inbound", "payload": payload})

        await paced_send(audio, chunk, PHONE_RATE, speed, media)

    async def read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in self.ws:
                self.last_message_ns = self.clock.now_ns()
                event = json.loads(message) if isinstance(message, str) else {}
                if event.get("event") == "media":
                    self._on_media(str(event.get("media", {}).get("payload", "")))
                elif event.get("event") == "mark":
                    self._on_mark(str(event.get("mark", {}).get("name", "")))
                elif event.get("event") == "clear":
                    for name, handle in list(self.marks.items()):  # Twilio returns pending marks at once
                        handle.cancel()
                        self._return_mark(name)
                    self.playing_until = time.monotonic()

    def _on_media(self, payload: str) -> None:
        self.media_ns.append(self.clock.now_ns())
        seconds = len(base64.b64decode(payload)) / PHONE_RATE
        self.playing_until = max(self.playing_until, time.monotonic()) + seconds

    def _on_mark(self, name: str) -> None:
        delay = max(0.0, self.playing_until - time.monotonic())
        self.marks[name] = asyncio.get_running_loop().call_later(delay, self._return_mark, name)

    def _return_mark(self, name: str) -> None:
        self.marks.pop(name, None)
        asyncio.ensure_future(self._send_quietly("mark", {"name": name}))

    async def _send_quietly(self, event: str, body: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.send(event, body)

    def done(self) -> bool:
        return not self.marks and self.clock.now_ns() - self.last_message_ns >= QUIET_S * 1e9


async def replay_twilio(
    recording: Recording, url: str, out: Path, speed: float, *, clock: Clock | None = None
) -> DriveResult:
    """The recording as a phone call to a Twilio Media Streams endpoint; voice-to-voice only."""
    clock = clock or MonotonicClock()
    stream_sid = "MZ" + uuid.uuid4().hex
    result = DriveResult(stream_sid)
    async with connect(url, max_size=None) as ws:
        phone = _Phone(ws, stream_sid, clock)
        await phone.start()
        reading = asyncio.create_task(phone.read())
        start_ns = clock.now_ns()
        await phone.say(with_trailing_silence(recording.audio), speed)
        await _wait_until(phone.done, reading)
        with contextlib.suppress(ConnectionClosed):
            await phone.send("stop", {"accountSid": "AC0", "callSid": "CA" + stream_sid[2:]})
        await asyncio.wait_for(reading, 10)
    write_phone_trace(out, stream_sid, clock, start_ns, speed, recording.speech_ends, phone.media_ns)
    return result


def write_phone_trace(
    out: Path,
    session: str,
    clock: Clock,
    start_ns: int,
    speed: float,
    speech_ends: dict[int, float],
    media_ns: list[int],
) -> None:
    """The recorded ends of speech on the replay's timeline, each with the first agent audio after it."""
    trace = Trace(out, session, clock)
    try:
        trace.write(SESSION_START, 0, t_ns=start_ns, transport="twilio-replay")
        ends = sorted((start_ns + int(seconds / speed * 1e9), turn) for turn, seconds in speech_ends.items())
        for i, (end_ns, turn) in enumerate(ends):
            trace.write(VAD_SPEECH_END, turn, t_ns=end_ns, source="recorded")
            until = ends[i + 1][0] if i + 1 < len(ends) else None
            first = next((t for t in media_ns if t >= end_ns and (until is None or t < until)), None)
            if first is not None:
                trace.write(OUT_FIRST_AUDIO, turn, t_ns=first)
        trace.write(SESSION_END, 0)
    finally:
        trace.close()
