"""`/ws`: the project's own WebSocket API (docs/protocol.md).

The client sends `session.start` (its audio format), then binary PCM16 mono frames at its rate, and may
type (`input.text`) or leave (`session.end`). The server sends the session's events as JSON and the
agent's voice as binary PCM16 at the client's rate, paced in real time (`Playout`), whose clock tells the
session what has been heard. Bad input gets an `error` event and the connection carries on; only a
refused client (key, origin, session cap), an idle one, or one whose session reached its length limit is
closed, with a close code and a reason.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.websockets import WebSocket

from voiceagent.gateway.channel import Channel, Idle
from voiceagent.gateway.codes import Close
from voiceagent.gateway.hub import LiveSession, SessionHub, SessionLimitError
from voiceagent.gateway.inbound import InboundAudio, push_frames
from voiceagent.gateway.outbound import Outbound
from voiceagent.gateway.playout import OutChunk
from voiceagent.gateway.security import check_client
from voiceagent.gateway.ws_protocol import (
    InputText,
    ProtocolError,
    SessionEnd,
    SessionStart,
    error_message,
    parse_client_message,
    session_started_message,
    session_too_long_message,
    session_too_long_reason,
)
from voiceagent.session import SessionOptions

log = logging.getLogger("voiceagent.gateway")
LEAD_MS = 100  # how far the agent's audio runs ahead of the listener (the client's playback buffer)


async def ws_endpoint(websocket: WebSocket) -> None:
    hub: SessionHub = websocket.app.state.hub
    refusal = check_client(websocket, hub.settings)
    await websocket.accept()
    channel = Channel(websocket, hub.settings.idle_timeout_s)
    if refusal is not None:
        hub.metrics.sessions_refused.labels("ws", refusal.close_code.name.lower()).inc()
        await channel.close(refusal.close_code, refusal.reason)
        return
    try:
        await _Connection(channel, hub).run()
    except Idle as idle:
        await channel.close(Close.IDLE, str(idle))
    except Exception:
        log.exception("a /ws session failed")
        await channel.close(Close.INTERNAL, "internal error; the session ended")
    await channel.close(Close.NORMAL, "session ended")


class _Connection:
    def __init__(self, channel: Channel, hub: SessionHub) -> None:
        self.channel, self.hub = channel, hub
        self.max_bytes = hub.settings.max_message_bytes

    async def error(self, code: str, message: str, **extra: object) -> None:
        await self.channel.send_json(error_message(code, message, **extra))

    async def run(self) -> None:
        start = await self._until_start()
        if start is None:
            return
        try:
            session = self.hub.open("ws", SessionOptions(output_rate=start.sample_rate))
            async with session as live:
                if not await self.hub.within_session_limit(self._serve(live, start)):
                    await self._too_long()
        except SessionLimitError as error:
            await self.error("session_limit", str(error))
            await self.channel.close(Close.TRY_AGAIN_LATER, "session limit reached")

    async def _too_long(self) -> None:
        limit = self.hub.session_limit_s
        await self.channel.send_json(session_too_long_message(limit))
        await self.channel.close(Close.TOO_LONG, session_too_long_reason(limit))

    async def _receive(self, live: LiveSession | None = None) -> str | bytes | None:
        """The next message within the size limit (oversized ones get an error and are skipped)."""
        busy = (lambda: live.session.replying) if live is not None else (lambda: False)
        while (message := await self.channel.receive(busy)) is not None:
            size = len(message) if isinstance(message, bytes) else len(message.encode())
            if size <= self.max_bytes:
                return message
            await self.error(
                "message_too_large", f"a message is limited to {self.max_bytes} bytes, got {size}"
            )
        return None

    async def _until_start(self) -> SessionStart | None:
        while (message := await self._receive()) is not None:
            if isinstance(message, bytes):
                await self.error("not_started", "send session.start before audio")
                continue
            try:
                parsed = parse_client_message(message)
            except ProtocolError as error:
                await self.error(error.code, error.message)
                continue
            if isinstance(parsed, SessionStart):
                return parsed
            if isinstance(parsed, SessionEnd):
                return None
            await self.error("not_started", "send session.start first")
        return None

    async def _serve(self, live: LiveSession, start: SessionStart) -> None:
        session = live.session
        inbound = InboundAudio(start.sample_rate)
        sink = WsSink(self.channel)
        outbound = Outbound(
            live, session.clock, start.sample_rate, sink, lead_ms=LEAD_MS, on_played=session.audio_played
        )
        await self.channel.send_json(session_started_message(live.id, "pcm16", start.sample_rate))
        async with outbound.sending(self._sending_failed):
            while (message := await self._receive(live)) is not None:
                if isinstance(message, bytes):
                    await self._audio(live, inbound, message)
                    continue
                try:
                    parsed = parse_client_message(message)
                except ProtocolError as error:
                    await self.error(error.code, error.message)
                    continue
                if isinstance(parsed, InputText):
                    await session.push_text(parsed.text)
                elif isinstance(parsed, SessionEnd):
                    return
                else:
                    await self.error("already_started", "the session has started; send session.end first")

    def _sending_failed(self, error: BaseException) -> None:
        """A sending task that fails ends this connection (closing it ends the receive loop)."""
        log.error("a /ws sending task failed", exc_info=error)
        asyncio.ensure_future(self.channel.close(Close.INTERNAL, "internal error; the session ended"))

    async def _audio(self, live: LiveSession, inbound: InboundAudio, data: bytes) -> None:
        try:
            frames = inbound.push_pcm16(data, self.hub.clock.now_ns())
        except ValueError as error:
            await self.error("bad_audio", str(error))
            return
        await push_frames(live.session, frames)


class WsSink:
    """/ws: the events as JSON text, the agent's voice as binary PCM16 at the client's rate. Nothing sent
    can be taken back at a barge-in: the client drops its buffer when `interrupted` comes."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    async def send_message(self, message: dict[str, Any]) -> None:
        await self.channel.send_json(message)

    async def send_audio(self, chunk: OutChunk) -> None:
        await self.channel.send_bytes(chunk.samples.astype("<i2", copy=False).tobytes())

    async def flush_audio(self, turn: int) -> None:
        pass
