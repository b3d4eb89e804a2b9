"""Abrupt disconnects at random points of a turn, and what they must leave behind: nothing.

Used by tests/gateway/test_disconnects.py (a short run) and bench/disconnects.py (1,000 drops). The server
runs in this process on `drop_pipeline()`: fake ears and voice (FakeEndpointer, FakeRecognizer,
FakeSynthesizer) around a REAL engine (tests/fakes.py `tiny_engine`) behind `LocalLLM`, whose blocks are
slowed down so a turn has a generation phase to drop in; the engine's cancellation and its shared lock are
exercised. A client speaks a short utterance and then drops the connection without a close frame (the
transport is aborted; every other drop with SO_LINGER 0, so the kernel sends a RST instead of a FIN) at a
random point: while speaking, while the agent thinks (transcript or first block out, no audio yet), or while
the agent's audio plays. Afterwards `Resources` compares the process with its state before the drops.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ctypes
import dataclasses
import gc
import json
import os
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from tests.fakes import FakeEndpointer, FakeRecognizer, FakeSynthesizer, WordChunker, tiny_engine
from voiceagent.audio import mulaw_encode
from voiceagent.llm import LocalLLM, ReplyOptions
from voiceagent.session import Session, SessionOptions

TRANSPORTS = ("ws", "twilio")
PHASES = ("utterance", "thinking", "speaking")
SPEECH_S, END_QUIET_S = 0.4, 0.3  # the fake endpointer ends speech after 10 quiet frames (200 ms)


# ----- the pipeline: fake ears and voice, a real tiny engine ------------------------------------------------


class ChatTokenizer:
    """tests/fakes.py's FakeTokenizer (id i decodes to ' w{i}') with a toy chat template: each word of each
    message becomes one id, so prompts stay short and the same history gives the same ids."""

    chat_template = "toy"
    eos_token_id = 0

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if i == 0 and skip_special_tokens else f" w{i}" for i in token_ids)

    def apply_chat_template(self, messages: Sequence[Any], **_: Any) -> list[int]:
        ids = []
        for message in messages:
            ids.append(1 + len(message["role"]))
            ids += [1 + sum(map(ord, word)) % 95 for word in message["content"].split()]
        return ids + [2]


class SlowConversation:
    """An engine conversation whose committed blocks each take `block_s` more (on the engine thread, like a
    slower model's forward passes)."""

    def __init__(self, conversation: Any, block_s: float) -> None:
        self._conversation, self.block_s = conversation, block_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conversation, name)

    def generate(self, prompt_ids: Sequence[int], params: Any = None, **options: Any) -> Iterator[Any]:
        blocks = self._conversation.generate(prompt_ids, params, **options)

        def slowed() -> Iterator[Any]:
            for block in blocks:
                time.sleep(self.block_s)
                yield block

        return slowed()


class DropPipeline:
    """`Pipeline.new_session` for the drops: each session gets its own conversation of one tiny engine."""

    def __init__(self, reply_tokens: int = 24, block_s: float = 0.03, word_ms: int = 40) -> None:
        self.engine = tiny_engine(max_seq_len=256)
        self.engine.tokenizer = ChatTokenizer()
        self.reply_tokens, self.block_s, self.word_ms = reply_tokens, block_s, word_ms
        self.sessions_made = 0

    def new_session(self, clock: Any, trace: Any, options: SessionOptions | None = None) -> Session:
        # The fake endpointer's own 200 ms rule ends each utterance (END_QUIET_S); the tiny engine's tokenizer
        # has no chat template, so no end-of-turn score could be had anyway.
        options = dataclasses.replace(
            options or SessionOptions(), reply=ReplyOptions(max_tokens=self.reply_tokens), turn_taking=None
        )
        conversation = SlowConversation(self.engine.new_conversation(), self.block_s)
        self.sessions_made += 1
        return Session(
            endpointer=FakeEndpointer(),
            recognizer=FakeRecognizer("hello there"),
            llm=LocalLLM(self.engine, conversation=conversation),  # type: ignore[arg-type]
            synthesizer=FakeSynthesizer(self.word_ms),
            new_chunker=WordChunker,
            clock=clock,
            trace=trace,
            options=options,
        )


# ----- the callers ------------------------------------------------------------------------------------------


def _tone(seconds: float, rate: int, amplitude: int = 8000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 440 * t)).astype(np.int16)


def abort(ws: ClientConnection, reset: bool) -> None:
    """Drops the TCP connection without a WebSocket close frame: FIN, or RST when `reset`."""
    if reset:
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.transport.abort()


@dataclass
class DropPlan:
    transport: str  # ws | twilio
    phase: str  # where the drop is aimed: utterance | thinking | speaking
    delay_s: float  # a random wait inside that phase
    reset: bool  # RST rather than FIN


@dataclass
class DropResult:
    plan: DropPlan
    seen: str  # what the caller had seen when it dropped: speaking | thinking | agent_audio


class _Caller:
    """One connection that speaks and watches what comes back, for either transport."""

    def __init__(self, ws: ClientConnection, transport: str) -> None:
        self.ws, self.transport = ws, transport
        self.types: list[str] = []  # /ws event types, or Twilio events
        self.events: list[dict[str, Any]] = []  # the JSON messages
        self.changed = asyncio.Event()
        self.reader = asyncio.create_task(self._read())
        self.rate = 16000 if transport == "ws" else 8000
        self.sequence = 0
        self.spoke_all = False  # the whole utterance and the silence that ends it were sent

    async def _read(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.types.append("audio")
                else:
                    parsed = json.loads(message)
                    self.events.append(parsed)
                    kind = parsed.get("type") or parsed.get("event")
                    self.types.append("audio" if kind == "media" else str(kind))
                self.changed.set()

    async def start(self) -> None:
        if self.transport == "ws":
            await self.ws.send(
                json.dumps({"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}})
            )
            await self.until(lambda: "session.started" in self.types)
        else:
            media_format = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
            await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            start = {"streamSid": "MZ0", "callSid": "CA0", "tracks": ["inbound"], "mediaFormat": media_format}
            await self.ws.send(json.dumps({"event": "start", "streamSid": "MZ0", "start": start}))

    async def send_frame(self, samples: np.ndarray) -> None:
        if self.transport == "ws":
            await self.ws.send(samples.astype("<i2").tobytes())
        else:
            self.sequence += 1
            payload = base64.b64encode(mulaw_encode(samples)).decode()
            media = {"track": "inbound", "payload": payload}
            sequence = str(self.sequence)
            await self.ws.send(
                json.dumps({"event": "media", "streamSid": "MZ0", "sequenceNumber": sequence, "media": media})
            )

    async def until(self, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    def seen(self) -> str:
        if "audio" in self.types:
            return "agent_audio"
        if self.spoke_all or any(kind in self.types for kind in ("transcript.final", "agent.block")):
            return "thinking"
        return "speaking"


async def _speak(caller: _Caller, audio: np.ndarray, stop_after_frames: int | None = None) -> None:
    """Sends `audio` in 20 ms frames at real pace (all of it, or the first `stop_after_frames`)."""
    step = caller.rate // 50
    started = time.monotonic()
    for i, offset in enumerate(range(0, len(audio), step)):
        if stop_after_frames is not None and i >= stop_after_frames:
            return
        await caller.send_frame(audio[offset : offset + step])
        await asyncio.sleep(max(0.0, started + (i + 1) * 0.02 - time.monotonic()))


async def drop_once(host: str, plan: DropPlan) -> DropResult:
    """Connects, starts, speaks, and drops the connection at the planned point."""
    path = "/ws" if plan.transport == "ws" else "/twilio"
    ws = await connect(f"ws://{host}{path}", open_timeout=10, close_timeout=1)
    caller = _Caller(ws, plan.transport)
    try:
        await caller.start()
        speech = _tone(SPEECH_S, caller.rate)
        quiet = np.zeros(int(END_QUIET_S * caller.rate), dtype=np.int16)
        if plan.phase == "utterance":
            await _speak(caller, speech, stop_after_frames=1 + int(plan.delay_s / 0.02))
        else:
            await _speak(caller, np.concatenate([speech, quiet]))
            caller.spoke_all = True
            if plan.phase == "speaking":
                await caller.until(lambda: "audio" in caller.types)
            elif plan.transport == "ws":
                await caller.until(lambda: "transcript.final" in caller.types)
            await asyncio.sleep(plan.delay_s)
        seen = caller.seen()
    finally:
        abort(ws, plan.reset)
        caller.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await caller.reader
    return DropResult(plan, seen)


def random_plans(n: int, rng: random.Random) -> list[DropPlan]:
    """`n` drops over both transports and the three phases, with random delays inside each phase."""
    plans = []
    for i in range(n):
        transport, phase = TRANSPORTS[i % 2], PHASES[(i // 2) % 3]
        delay = {"utterance": rng.uniform(0.0, SPEECH_S), "thinking": rng.uniform(0.0, 0.08),
                 "speaking": rng.uniform(0.0, 0.6)}[phase]  # fmt: skip
        plans.append(DropPlan(transport, phase, delay, reset=rng.random() < 0.5))
    rng.shuffle(plans)
    return plans


async def drop_many(
    host: str, plans: Sequence[DropPlan], concurrency: int, progress: Callable[[int], None] | None = None
) -> list[DropResult]:
    """Runs the plans `concurrency` at a time (each wave starts its calls a few ms apart)."""
    results: list[DropResult] = []
    for start in range(0, len(plans), concurrency):
        wave = plans[start : start + concurrency]
        results += await asyncio.gather(*(_staggered(host, plan, i * 0.005) for i, plan in enumerate(wave)))
        if progress is not None:
            progress(len(results))
    return results


async def _staggered(host: str, plan: DropPlan, delay_s: float) -> DropResult:
    await asyncio.sleep(delay_s)
    return await drop_once(host, plan)


def tally(results: Sequence[DropResult]) -> dict[str, int]:
    """Drops by transport and by what the caller had seen: e.g. {"ws/agent_audio": 41, ...}."""
    return dict(sorted(Counter(f"{r.plan.transport}/{r.seen}" for r in results).items()))


# ----- after the drops --------------------------------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trimmed_resident_bytes() -> int:
    """Resident memory once glibc has handed its free heap pages back (malloc_trim): what is live. Without
    the trim, RSS keeps the high-water mark of each thread's malloc arena (every reply runs on a new
    thread), ~3% over the baseline here and flat, which is no leak."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return resident_bytes()


POOL_THREADS = ("voice-tts", "asyncio_", "ThreadPoolExecutor")  # bounded worker pools, kept between calls


@dataclass
class Resources:
    """What a process holds: its asyncio tasks, threads outside the worker pools, fds and memory (resident,
    as is and after a malloc_trim)."""

    tasks: set[asyncio.Task[Any]]
    threads: set[str] = field(default_factory=set)
    fds: int = 0
    raw_rss: int = 0
    rss: int = 0

    @classmethod
    def now(cls) -> Resources:
        gc.collect()
        tasks = {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}
        threads = {t.name for t in threading.enumerate() if not t.name.startswith(POOL_THREADS)}
        return cls(tasks, threads, open_fds(), resident_bytes(), trimmed_resident_bytes())

    def leaks_since(self, baseline: Resources) -> dict[str, Any]:
        """What is here now that was not in `baseline` (empty lists and no extra fds: nothing leaked)."""
        return {
            "tasks": sorted(repr(task.get_coro()) for task in self.tasks - baseline.tasks),
            "threads": sorted(self.threads - baseline.threads),
            "extra_fds": self.fds - baseline.fds,
            "rss_growth": (self.rss - baseline.rss) / baseline.rss,
            "raw_rss_growth": (self.raw_rss - baseline.raw_rss) / baseline.raw_rss,
        }


async def settle(
    hub: Any, engine: Any, timeout_s: float = 20.0, baseline: Resources | None = None
) -> Resources:
    """Waits until no session is live and the engine is idle, its thread running nothing (and, with a
    baseline, until no task outlives it: sessions finish closing a little after their sockets), then takes
    stock."""
    from engine.engine_thread import ENGINE_THREAD

    lock = engine.lock
    deadline = time.monotonic() + timeout_s
    while True:
        quiet = not hub.live and not lock.locked() and ENGINE_THREAD.idle()
        now = Resources.now()
        if quiet and (baseline is None or not now.tasks - baseline.tasks):
            return now
        if time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.05)


def gauges(hub: Any) -> dict[str, float]:
    """voiceagent_sessions_active per transport, from the gateway's own registry."""
    registry = hub.metrics.registry
    return {
        t: registry.get_sample_value("voiceagent_sessions_active", {"transport": t}) or 0.0
        for t in TRANSPORTS
    }


async def one_full_turn(host: str) -> dict[str, Any]:
    """A /ws session that speaks once and waits for the whole reply: its `turn.metrics` and reply text."""
    async with connect(f"ws://{host}/ws", open_timeout=10) as ws:
        caller = _Caller(ws, "ws")
        await caller.start()
        await _speak(
            caller, np.concatenate([_tone(SPEECH_S, 16000), np.zeros(int(END_QUIET_S * 16000), np.int16)])
        )
        await caller.until(lambda: "turn.metrics" in caller.types, timeout_s=20)
        await ws.send(json.dumps({"type": "session.end"}))
        await caller.reader
    metrics = next(e for e in caller.events if e["type"] == "turn.metrics")
    reply = "".join(e["text"] for e in caller.events if e["type"] == "agent.block")
    return {"metrics": metrics, "reply": reply, "close_code": ws.close_code}
