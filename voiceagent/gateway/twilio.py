"""Phone calls: `POST /twilio/voice` answers with TwiML that connects the call to `/twilio`, a bidirectional
Twilio Media Stream (docs/protocol.md).

The caller's mu-law 8 kHz audio becomes the session's frames; the agent's voice goes back as mu-law
`media` in 100 ms chunks, each followed by a `mark` named `TURN:SAMPLES`. Twilio returns a mark when the
caller has heard the audio before it, so only returned marks count as played: at a barge-in the history
keeps the words the caller heard. A barge-in sends `clear`, which flushes Twilio's buffer (the marks it
then returns for the flushed audio are ignored). Phone lines have no echo cancellation of ours, so the
session runs with its echo guard. With VOICEAGENT_TWILIO_AUTH_TOKEN set, both endpoints check
X-Twilio-Signature (required when VOICEAGENT_API_KEY is set: Twilio cannot send the key). Twilio has
no error message: a message out of order or malformed closes the stream with a close code and reason.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.websockets import WebSocket

from voiceagent.audio import mulaw_encode
from voiceagent.gateway import twilio_protocol as tp
from voiceagent.gateway.body import BodyError, read_body
from voiceagent.gateway.channel import Channel, Idle
from voiceagent.gateway.codes import Close
from voiceagent.gateway.hub import LiveSession, SessionHub, SessionLimitError
from voiceagent.gateway.inbound import InboundAudio, push_frames
from voiceagent.gateway.outbound import Outbound
from voiceagent.gateway.playout import OutChunk
from voiceagent.gateway.security import public_origin, twilio_refusal
from voiceagent.session import Session, SessionOptions
from voiceagent.trace import IN_DTMF, IN_UNKNOWN, TWILIO_START

log = logging.getLogger("voiceagent.gateway")
CHUNK_MS = 100  # one media message and one mark per 100 ms of the agent's voice
LEAD_MS = 200
MAX_FORM_BYTES = 65536


async def twilio_voice(request: Request) -> Response:
    """Twilio's voice webhook: TwiML that streams the call to this server's /twilio."""
    hub: SessionHub = request.app.state.hub
    try:
        body = await read_body(request, MAX_FORM_BYTES)
    except BodyError as error:
        return PlainTextResponse(error.message, status_code=error.status)
    params = dict(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))
    if (refusal := twilio_refusal(request, hub.settings, params)) is not None:
        return PlainTextResponse(refusal, status_code=403)
    stream_url = public_origin(request, hub.settings, "ws") + "/twilio"
    return Response(tp.connect_twiml(stream_url), media_type="application/xml")


async def twilio_stream(websocket: WebSocket) -> None:
    hub: SessionHub = websocket.app.state.hub
    refusal = twilio_refusal(websocket, hub.settings, {})
    await websocket.accept()
    channel = Channel(websocket, hub.settings.idle_timeout_s)
    if refusal is not None:
        hub.metrics.sessions_refused.labels("twilio", "unauthorized").inc()
        await channel.close(Close.UNAUTHORIZED, refusal)
        return
    try:
        await _Call(channel, hub).run()
    except tp.TwilioProtocolError as error:
        await channel.close(error.close_code, error.reason)
    except Idle as idle:
        await channel.close(Close.IDLE, str(idle))
    except Exception:
        log.exception("a /twilio stream failed")
        await channel.close(Close.INTERNAL, "internal error; the stream ended")
    await channel.close(Close.NORMAL, "stream ended")


class _Call:
    def __init__(self, channel: Channel, hub: SessionHub) -> None:
        self.channel, self.hub = channel, hub

    async def _receive(self, live: LiveSession | None = None) -> tp.TwilioMessage | None:
        busy = (lambda: live.session.replying) if live is not None else (lambda: False)
        message = await self.channel.receive(busy)
        if message is None:
            return None
        if isinstance(message, bytes):
            raise tp.TwilioProtocolError(Close.INVALID_DATA, "Twilio messages are JSON text")
        if len(message.encode()) > self.hub.settings.max_message_bytes:
            raise tp.TwilioProtocolError(Close.TOO_BIG, "message over the size limit")
        return tp.parse(message)

    async def _until_start(self) -> tp.Start | None:
        while (message := await self._receive()) is not None:
            if isinstance(message, tp.Start):
                return message
            if isinstance(message, tp.Stop):
                return None
            if not isinstance(message, tp.Connected | tp.Unknown):
                name = type(message).__name__.lower()
                raise tp.TwilioProtocolError(Close.POLICY, f"{name} before start")
        return None

    async def run(self) -> None:
        start = await self._until_start()
        if start is None:
            return
        options = SessionOptions(output_rate=tp.TWILIO_RATE, echo_guard=True)
        try:
            session = self.hub.open("twilio", options)
            async with session as live:
                live.trace.write(TWILIO_START, 0, stream_sid=start.stream_sid, call_sid=start.call_sid)
                if not await self.hub.within_session_limit(self._serve(live, start.stream_sid)):
                    reason = f"the call reached its {self.hub.session_limit_s:g} s limit"
                    await self.channel.close(Close.TOO_LONG, reason)
        except SessionLimitError:
            await self.channel.close(Close.TRY_AGAIN_LATER, "session limit reached")

    async def _serve(self, live: LiveSession, stream_sid: str) -> None:
        inbound = InboundAudio(tp.TWILIO_RATE)
        sink = TwilioSink(self.channel, live.session, stream_sid)
        outbound = Outbound(
            live, live.session.clock, tp.TWILIO_RATE, sink, chunk_ms=CHUNK_MS, lead_ms=LEAD_MS
        )
        async with outbound.sending(self._sending_failed):
            while (message := await self._receive(live)) is not None:
                if isinstance(message, tp.Media):
                    if message.track in ("inbound", "inbound_track"):
                        frames = inbound.push_mulaw(message.payload, self.hub.clock.now_ns())
                        await push_frames(live.session, frames)
                elif isinstance(message, tp.Mark):
                    sink.mark_returned(message.name)
                elif isinstance(message, tp.Dtmf):
                    live.trace.write(IN_DTMF, live.session.turn, digit=message.digit)
                elif isinstance(message, tp.Stop):
                    return
                elif isinstance(message, tp.Start):
                    raise tp.TwilioProtocolError(Close.POLICY, "a second start on one stream")
                elif isinstance(message, tp.Unknown):
                    live.trace.write(IN_UNKNOWN, live.session.turn, twilio_event=message.event)

    def _sending_failed(self, error: BaseException) -> None:
        log.error("a /twilio sending task failed", exc_info=error)
        asyncio.ensure_future(self.channel.close(Close.INTERNAL, "internal error; the stream ended"))


class TwilioSink:
    """The agent's voice as Twilio `media` (mu-law) with a `mark` named `TURN:SAMPLES` after each chunk;
    a barge-in sends `clear`; returned marks -> the session's played position. Twilio takes none of the
    /ws events."""

    def __init__(self, channel: Channel, session: Session, stream_sid: str) -> None:
        self.channel, self.session, self.stream_sid = channel, session, stream_sid
        self._sent: dict[int, int] = {}  # turn -> samples sent
        self._cleared: set[int] = set()

    async def send_message(self, message: dict[str, Any]) -> None:
        pass

    async def send_audio(self, chunk: OutChunk) -> None:
        self._sent[chunk.turn] = chunk.end_sample
        await self.channel.send_json(tp.media_message(self.stream_sid, mulaw_encode(chunk.samples)))
        await self.channel.send_json(tp.mark_message(self.stream_sid, f"{chunk.turn}:{chunk.end_sample}"))

    async def flush_audio(self, turn: int) -> None:
        if self._sent.get(turn, 0) > 0:
            self._cleared.add(turn)
            await self.channel.send_json(tp.clear_message(self.stream_sid))

    def mark_returned(self, name: str) -> None:
        """Twilio played everything before this mark (or flushed it, after a clear: ignored)."""
        turn_text, _, samples_text = name.partition(":")
        if not (turn_text.isdigit() and samples_text.isdigit()) or len(name) > 24:
            return  # not one of ours (and never an int() of thousands of digits)
        turn = int(turn_text)
        sent = self._sent.get(turn, 0)
        if sent and turn not in self._cleared:  # at most what was sent: a mark cannot claim more
            self.session.audio_played(turn, min(int(samples_text), sent))
