"""Channel's idle timeout (one lazy timer per connection, not an asyncio.timeout per message): it ends a
silent connection, never a talking or busy one, and passes other cancellations on untouched."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from starlette.websockets import WebSocketState

from voiceagent.gateway.channel import Channel, Idle


class QueueSocket:
    """The part of a Starlette WebSocket that Channel.receive uses, fed from a queue."""

    application_state = WebSocketState.CONNECTED

    def __init__(self) -> None:
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(self) -> dict[str, Any]:
        return await self.messages.get()

    def say(self, text: str) -> None:
        self.messages.put_nowait({"type": "websocket.receive", "text": text})


def test_a_talking_client_is_never_idle_and_a_silent_one_is_after_the_timeout() -> None:
    async def scenario() -> None:
        socket = QueueSocket()
        channel = Channel(socket, idle_timeout_s=0.2)  # type: ignore[arg-type]

        async def talk() -> None:
            for i in range(20):  # 1 s of messages, 50 ms apart: far longer than the timeout in all
                await asyncio.sleep(0.05)
                socket.say(str(i))

        talker = asyncio.create_task(talk())
        received = [await channel.receive() for _ in range(20)]
        assert received == [str(i) for i in range(20)]
        await talker
        started = time.monotonic()
        with pytest.raises(Idle):
            await channel.receive()
        assert 0.19 < time.monotonic() - started < 0.6
        assert channel._timer is None

    asyncio.run(scenario())


def test_a_busy_agent_keeps_a_silent_connection_open() -> None:
    async def scenario() -> None:
        socket = QueueSocket()
        channel = Channel(socket, idle_timeout_s=0.1)  # type: ignore[arg-type]
        asyncio.get_running_loop().call_later(0.45, socket.say, "late")
        assert await channel.receive(busy=lambda: True) == "late"

    asyncio.run(scenario())


def test_a_cancellation_from_elsewhere_is_not_taken_for_idleness() -> None:
    async def scenario() -> None:
        socket = QueueSocket()
        channel = Channel(socket, idle_timeout_s=0.1)  # type: ignore[arg-type]
        waiting = asyncio.create_task(channel.receive())
        await asyncio.sleep(0.03)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        socket.messages.put_nowait({"type": "websocket.disconnect", "code": 1006})
        assert await channel.receive() is None  # the peer left: None, and the timer is gone
        assert channel._timer is None and not channel.open

    asyncio.run(scenario())
