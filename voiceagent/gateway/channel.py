"""One accepted WebSocket, as the transports use it: sends one at a time, receives with an idle timeout,
closes once with a reason, and never raises because the peer has gone (sending then does nothing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from voiceagent.gateway.codes import Close


class Idle(Exception):
    """Nothing arrived for the idle timeout."""


class Channel:
    def __init__(self, websocket: WebSocket, idle_timeout_s: float) -> None:
        self.websocket, self.idle_timeout_s = websocket, idle_timeout_s
        self._send_lock = asyncio.Lock()
        self.open = True

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
                async with asyncio.timeout(self.idle_timeout_s):
                    message = await self.websocket.receive()
            except TimeoutError:
                if busy():
                    continue
                raise Idle(f"nothing received for {self.idle_timeout_s:g} s") from None
            except (WebSocketDisconnect, RuntimeError):
                self.open = False
                return None
            if message["type"] == "websocket.disconnect":
                self.open = False
                return None
            if message.get("bytes") is not None:
                return bytes(message["bytes"])
            return str(message.get("text") or "")

    async def close(self, code: Close, reason: str) -> None:
        async with self._send_lock:
            if not self.open:
                return
            self.open = False
            if self.websocket.application_state != WebSocketState.DISCONNECTED:
                try:
                    await self.websocket.close(int(code), reason.encode()[:120].decode(errors="ignore"))
                except (WebSocketDisconnect, RuntimeError, OSError):
                    pass  # the peer went away first
