"""A Twilio Media Streams simulator: the phone side of a bidirectional `<Connect><Stream>`.

It sends the caller's audio as base64 mu-law `media` (20 ms each, at real pace), plays the agent's media
in real time and returns each `mark` when playback reaches it, as Twilio does. On `clear` it empties its
playback buffer and returns the marks still pending at once (Twilio's behaviour too).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections import deque
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from voiceagent.audio import mulaw_encode

RATE = 8000


class TwilioCaller:
    def __init__(self, ws: ClientConnection, stream_sid: str = "MZ00000000000000000000000000000000") -> None:
        self.ws, self.stream_sid = ws, stream_sid
        self.media_bytes = 0  # mu-law bytes received (one per sample at 8 kHz)
        self.marks_sent_back: list[str] = []  # in order, as played (or flushed by a clear)
        self.marks_played: list[str] = []  # returned because their audio played (not flushed)
        self.marks_received: list[str] = []
        self.clears: list[float] = []  # time.monotonic() of each clear
        self.media_after_clear = 0
        self.events: list[str] = []  # every event received, in order
        self.closed: tuple[int, str] | None = None
        self._buffer: deque[tuple[str, Any]] = deque()  # ("audio", samples) | ("mark", name)
        self._sequence = 0
        self._changed = asyncio.Event()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._play())]

    async def send(self, event: str, body: dict[str, Any] | None = None) -> None:
        self._sequence += 1
        message: dict[str, Any] = {"event": event, "sequenceNumber": str(self._sequence)}
        if event != "connected":
            message["streamSid"] = self.stream_sid
        message.update({event: body} if body is not None else {})
        await self.ws.send(json.dumps(message))

    async def connect_and_start(self) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        media_format = {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}
        await self.send(
            "start",
            {
                "streamSid": self.stream_sid,
                "accountSid": "AC0",
                "callSid": "CA0",
                "tracks": ["inbound"],
                "mediaFormat": media_format,
                "customParameters": {},
            },
        )

    async def say(self, pcm16_8k: np.ndarray) -> None:
        """The caller speaks: 20 ms media messages at real pace."""
        start = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm16_8k), 160)):
            payload = base64.b64encode(mulaw_encode(pcm16_8k[offset : offset + 160])).decode()
            await self.send("media", {"track": "inbound", "chunk": str(i + 1), "timestamp": str(20 * i),
                                      "payload": payload})  # fmt: skip
            await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))

    def played_samples(self, turn: int) -> int:
        """What the marks returned by playback (not flushed by a clear) say was played of `turn`."""
        played = [int(m.split(":")[1]) for m in self.marks_played if m.startswith(f"{turn}:")]
        return max(played, default=0)

    async def wait(self, condition: Any, timeout_s: float = 15.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self._changed.clear()
                with contextlib.suppress(TimeoutError):  # also polls conditions on server state
                    await asyncio.wait_for(self._changed.wait(), 0.05)

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                message = json.loads(raw)
                self.events.append(message["event"])
                assert message["streamSid"] == self.stream_sid
                if message["event"] == "media":
                    audio = base64.b64decode(message["media"]["payload"])
                    self.media_bytes += len(audio)
                    self.media_after_clear += len(audio)
                    self._buffer.append(("audio", len(audio)))
                elif message["event"] == "mark":
                    self.marks_received.append(message["mark"]["name"])
                    self._buffer.append(("mark", message["mark"]["name"]))
                elif message["event"] == "clear":
                    self.clears.append(time.monotonic())
                    self.media_after_clear = 0
                    pending = [name for kind, name in self._buffer if kind == "mark"]
                    self._buffer.clear()
                    for name in pending:
                        await self._return_mark(name)
                self._changed.set()
        except ConnectionClosed:
            pass
        self.closed = (self.ws.close_code or 1006, self.ws.close_reason or "")
        self._changed.set()

    async def _play(self) -> None:
        while True:
            if not self._buffer:
                await asyncio.sleep(0.005)
                continue
            kind, value = self._buffer.popleft()
            if kind == "audio":
                await asyncio.sleep(value / RATE)
            else:
                self.marks_played.append(value)
                await self._return_mark(value)

    async def _return_mark(self, name: str) -> None:
        self.marks_sent_back.append(name)
        with contextlib.suppress(ConnectionClosed):
            await self.send("mark", {"name": name})
        self._changed.set()

    async def stop(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.send("stop", {"accountSid": "AC0", "callSid": "CA0"})
        await self.wait(lambda: self.closed is not None)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
