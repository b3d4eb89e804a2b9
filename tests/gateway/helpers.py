"""Gateway test helpers: an app on fakes served by uvicorn on a free loopback port, a WebSocket client that
records what the server sends, and audio to speak into it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.fakes import FakePipeline
from tests.support.servers import free_port
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app
from voiceagent.gateway.serve import uvicorn_config


def fake_app(pipeline: FakePipeline | None = None, **settings: Any) -> tuple[Starlette, FakePipeline]:
    pipeline = pipeline or FakePipeline()
    return build_app(pipeline, Settings(**settings)), pipeline


@contextlib.asynccontextmanager
async def running(app: Starlette) -> AsyncIterator[str]:
    """Serves `app` on 127.0.0.1 on a free port; yields "127.0.0.1:PORT"."""
    hub = app.state.hub
    port = free_port()
    server = uvicorn.Server(uvicorn_config(app, hub.settings, "127.0.0.1", port))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()
            raise RuntimeError("the server stopped before it started")
        await asyncio.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


def tone(seconds: float, rate: int, amplitude: int = 8000, hz: float = 440.0) -> np.ndarray:
    """A tone the fake endpointer hears as speech (its peak is over 1000; 4000 with the echo guard)."""
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def quiet(seconds: float, rate: int) -> np.ndarray:
    return np.zeros(int(seconds * rate), dtype=np.int16)


class Client:
    """A WebSocket client that records every message the server sends, in the background."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.audio: list[tuple[float, bytes]] = []  # (arrival time.monotonic(), bytes)
        self.closed: tuple[int, str] | None = None
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.audio.append((time.monotonic(), message))
                else:
                    self.events.append({**json.loads(message), "_t": time.monotonic()})
                self._changed.set()
        except ConnectionClosed:
            pass
        close = self.ws.close_code, self.ws.close_reason
        self.closed = (close[0] or 1006, close[1] or "")
        self._changed.set()

    async def send_json(self, message: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(message))

    async def wait(self, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def event(self, kind: str, timeout_s: float = 10.0, after: int = 0) -> dict[str, Any]:
        """The first event of `kind` (at index >= `after`), waiting for it."""
        arrived = lambda: any(e["type"] == kind for e in self.events[after:])  # noqa: E731
        await self.wait(lambda: arrived() or self.closed is not None, timeout_s)
        for event in self.events[after:]:
            if event["type"] == kind:
                return event
        raise AssertionError(f"closed {self.closed} before a {kind!r} event; got {self.types()}")

    async def closed_with(self, timeout_s: float = 10.0) -> tuple[int, str]:
        await self.wait(lambda: self.closed is not None, timeout_s)
        assert self.closed is not None
        return self.closed

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def audio_bytes(self) -> int:
        return sum(len(chunk) for _, chunk in self.audio)

    async def stream(self, pcm16: np.ndarray, rate: int, frame_ms: int = 20, pace: bool = True) -> None:
        """Sends `pcm16` as binary frames of `frame_ms`, in real time when `pace`."""
        step = rate * frame_ms // 1000
        start = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm16), step)):
            await self.ws.send(pcm16[offset : offset + step].astype("<i2").tobytes())
            if pace:
                await asyncio.sleep(max(0.0, start + (i + 1) * frame_ms / 1000 - time.monotonic()))

    async def close(self) -> None:
        await self.ws.close()
        await self._reader


@contextlib.asynccontextmanager
async def client(host: str, path: str = "/ws", **options: Any) -> AsyncIterator[Client]:
    async with connect(f"ws://{host}{path}", **options) as ws:
        recorder = Client(ws)
        try:
            yield recorder
        finally:
            recorder._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await recorder._reader


class RecordingPipeline:
    """A pipeline (the real one, loaded once per module) that keeps the sessions it made, so a test can read
    their history and trace."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline, self.settings = pipeline, pipeline.settings
        self.sessions: list[Any] = []

    async def warm_up(self) -> None:
        await self.pipeline.warm_up()

    def new_session(self, clock: Any, trace: Any, options: Any = None) -> Any:
        session = self.pipeline.new_session(clock, trace, options)
        self.sessions.append(session)
        return session
