"""One accepted WebSocket, as the transports use it: sends one at a time, receives with an idle timeout,
closes once with a reason, and never raises because the peer has gone (sending then does nothing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from starlette.types import Message
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from voiceagent.gateway.codes import Close


class Idle(Exception):
    """Nothing arrived for the idle timeout."""


class Channel:
    def __init__(self, websocket: WebSocket, idle_timeout_s: float) -> None:
        self.websocket, self.idle_timeout_s = websocket, idle_timeout_s
        self._send_lock = asyncio.Lock()
        self.open = True
        # The idle timeout is one lazy timer, not an asyncio.timeout per message (a phone call sends 50 a
        # second): each receive only moves the deadline on; the timer, when it fires early, re-arms itself
        # for the deadline, and cancels the waiting receive once the deadline has passed.
        self._deadline = 0.0  # loop time at which the current wait for a message runs out
        self._timer: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Task[Any] | None = None  # the task waiting for a message, while it waits
        self._expired = False  # the timer cancelled the waiter

    async def send_json(self, message: dict[str, Any]) -> None:
        await self._send({"type": "websocket.send", "text": json.dumps(message)})

    async def send_bytes(self, data: bytes) -> None:
        await self._send({"type": "websocket.send", "bytes": data})

    async def _send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            if not self.open:
                return
            try:
                await self.websocket.send(message)
            except (WebSocketDisconnect, RuntimeError, OSError):
                self.open = False  # the peer went away; the receiving side will notice and end

    async def receive(self, busy: Callable[[], bool] = lambda: False) -> str | bytes | None:
        """The next message (text or bytes), None once the peer has gone. Raises `Idle` after the idle
        timeout without a message, unless `busy()` says the agent is still replying."""
        while True:
            try:
                message = await self._receive_before_deadline()
            except TimeoutError:
                if busy():
                    continue
                self._stop_timer()
                raise Idle(f"nothing received for {self.idle_timeout_s:g} s") from None
            except (WebSocketDisconnect, RuntimeError):
                self.open = False
                self._stop_timer()
                return None
            if message["type"] == "websocket.disconnect":
                self.open = False
                self._stop_timer()
                return None
            if message.get("bytes") is not None:
                return bytes(message["bytes"])
            return str(message.get("text") or "")

    async def _receive_before_deadline(self) -> Message:
        """websocket.receive(), or TimeoutError once `idle_timeout_s` pass without a message. A
        cancellation from elsewhere is passed on as it is (as asyncio.timeout does)."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._deadline = loop.time() + self.idle_timeout_s
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._on_timer)
        self._waiter, self._expired = task, False
        try:
            return await self.websocket.receive()
        except asyncio.CancelledError:
            if self._expired and task.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            self._waiter = None

    def _on_timer(self) -> None:
        self._timer = None
        if self._waiter is None:
            return  # not waiting (busy with a message): the next receive arms the timer again
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._on_timer)
        else:
            self._expired = True
            self._waiter.cancel()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def close(self, code: Close, reason: str) -> None:
        self._stop_timer()
        async with self._send_lock:
            if not self.open:
                return
            self.open = False
            if self.websocket.application_state != WebSocketState.DISCONNECTED:
                try:
                    await self.websocket.close(int(code), reason.encode()[:120].decode(errors="ignore"))
                except (WebSocketDisconnect, RuntimeError, OSError):
                    pass  # the peer went away first
