"""One browser over WebRTC: its peer connection, its voice session, and the events between them.

The browser's microphone arrives as an Opus track; its frames go to the session as 20 ms PCM16 16 kHz,
stamped with their arrival as on /ws and Twilio. The agent's voice leaves as an Opus track: `Outbound`'s
`Playout` hands it out in real time, at most `LEAD_MS` ahead, to an `OutboundAudioTrack`, which is the
output clock and reports played samples to the session. The track keeps a queue of its own because
aiortc pulls a frame whenever it can encode one: the track must pace those pulls (and fill them with
silence) on its own clock, and its queue holds the playout's lead between the two clocks; it is flushed
at a barge-in. Events travel as JSON on the data channel the browser opened ("events"), the
same messages as on /ws (docs/protocol.md); the browser sends `input.text` and `session.end` there too.

The peer ends when the browser says `session.end`, closes the channel or the connection, when ICE has
not connected within `CONNECT_TIMEOUT_S`, when its microphone has sent nothing for `MEDIA_TIMEOUT_S` (a
browser that closed without a goodbye: ICE consent checks would notice only after 30 s), when the session
reaches VOICEAGENT_MAX_SESSION_S (after a `session_too_long` error event), or when the gateway shuts down;
every task is cancelled and awaited, the connection closed, and the session's slot freed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import av
from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from voiceagent.clock import Clock
from voiceagent.gateway.hub import LiveSession, SessionHub
from voiceagent.gateway.inbound import InboundAudio, push_frames
from voiceagent.gateway.outbound import Outbound
from voiceagent.gateway.playout import OutChunk
from voiceagent.gateway.webrtc_tracks import OutboundAudioTrack, frame_to_mono_pcm16
from voiceagent.gateway.ws_protocol import (
    InputText,
    ProtocolError,
    SessionEnd,
    error_message,
    parse_client_message,
    session_started_message,
    session_too_long_message,
)
from voiceagent.session import SessionOptions

OPUS_RATE = 48000  # the agent speaks at Opus's own rate: one resampling, in TTS
CONNECT_TIMEOUT_S = 20.0
MEDIA_TIMEOUT_S = 10.0  # a browser sends its microphone every 20 ms, silence included, even when muted
LEAD_MS = 100  # how far the playout runs ahead of the track: what a barge-in has to drop
EVENTS_CHANNEL = "events"
log = logging.getLogger(__name__)


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancels `task` and waits for it to end."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: a failure was already reported by _task_done


class WebRtcPeer:
    """Answers one offer and runs the session until the browser leaves (see the module docstring)."""

    def __init__(self, hub: SessionHub, clock: Clock, max_message_bytes: int) -> None:
        self.hub, self.clock, self.max_message_bytes = hub, clock, max_message_bytes
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = OutboundAudioTrack(clock, OPUS_RATE, self._played)
        self.session_id = ""
        self._live: LiveSession | None = None
        self._channel: RTCDataChannel | None = None
        self._unsent: list[dict[str, Any]] = []  # events before the data channel opened
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended = asyncio.Event()

    async def run(
        self, offer: RTCSessionDescription, answered: asyncio.Future[RTCSessionDescription]
    ) -> None:
        """Opens the session (the hub's cap applies), sets `answered` to the answer, and runs until the
        browser leaves. An error before the answer (a full hub, a bad offer) goes to `answered`."""
        try:
            async with self.hub.open("webrtc", SessionOptions(output_rate=OPUS_RATE)) as live:
                self._live, self.session_id = live, live.id
                answer = await self._answer(offer)
                answered.set_result(answer)
                await self._serve(live)
        except Exception as error:
            if not answered.done():
                answered.set_exception(error)
                return
            raise
        finally:
            if not answered.done():  # cancelled while answering: the server is shutting down
                answered.set_exception(ConnectionError("the server closed the session before answering"))
            await self._shut_down()

    def end(self) -> None:
        self._ended.set()

    # ----- connection ------------------------------------------------------------------------------

    async def _answer(self, offer: RTCSessionDescription) -> RTCSessionDescription:
        self.pc.addTrack(self.track)
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_channel)
        self.pc.on("connectionstatechange", self._on_connection_state)
        await self.pc.setRemoteDescription(offer)
        # aiortc gathers every candidate inside setLocalDescription: the answer is complete (no trickle).
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return self.pc.localDescription

    async def _serve(self, live: LiveSession) -> None:
        outbound = Outbound(live, self.clock, OPUS_RATE, TrackSink(self.track, self._send), lead_ms=LEAD_MS)
        self._start(outbound.pump())
        self._start(outbound.playout.run())
        self._start(self._connect_timeout())
        await self._until_ended()

    async def _until_ended(self) -> None:
        """Until the peer ends, or its session reaches VOICEAGENT_MAX_SESSION_S (the browser is told)."""

        async def ended() -> None:
            await self._ended.wait()

        if not await self.hub.within_session_limit(ended()):
            self._send(session_too_long_message(self.hub.session_limit_s))
            self.end()

    async def _connect_timeout(self) -> None:
        await asyncio.sleep(CONNECT_TIMEOUT_S)
        if self.pc.connectionState != "connected":
            self.end()

    def _on_connection_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.end()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._start(self._pump_microphone(track))

    def _on_channel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL:
            return
        self._channel = channel
        channel.on("message", self._on_message)
        channel.on("close", self.end)
        started = session_started_message(self.session_id, "opus", OPUS_RATE, transport="webrtc")
        pending, self._unsent = self._unsent, []
        for message in [started, *pending]:
            self._send(message)

    async def _shut_down(self) -> None:
        tasks, self._tasks = list(self._tasks), set()
        await asyncio.gather(*(_cancel(task) for task in tasks))
        self.track.stop()
        try:
            await self.pc.close()
        except Exception as error:  # noqa: BLE001 - aiortc on a connection it half set up: nothing to free
            # Found by fuzzing: a mangled offer that aiortc answered left its SCTP transport half made, and
            # close() raised AttributeError; the session had ended, only this close failed.
            log.warning("closing a WebRTC connection failed: %s: %s", type(error).__name__, error)

    def _start(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A bug in this peer: tell the browser in words and end this session only.
            self._send(error_message("internal", f"the WebRTC session failed: {task.exception()}"))
            self.end()

    # ----- in ------------------------------------------------------------------------------------------

    async def _pump_microphone(self, track: MediaStreamTrack) -> None:
        assert self._live is not None
        inbound: InboundAudio | None = None
        while True:
            try:  # no deadline for the first frame: ICE and DTLS come first (CONNECT_TIMEOUT_S)
                async with asyncio.timeout(None if inbound is None else MEDIA_TIMEOUT_S):  # no task a frame
                    frame = await track.recv()
            except MediaStreamError:
                return  # the browser stopped sending
            except TimeoutError:
                log.info("no audio from the browser for %g s: the session ends", MEDIA_TIMEOUT_S)
                self.end()
                return
            if not isinstance(frame, av.AudioFrame):
                continue
            if inbound is None or inbound.rate != frame.sample_rate:
                inbound = InboundAudio(frame.sample_rate)
            frames = inbound.push(frame_to_mono_pcm16(frame), self.clock.now_ns())
            await push_frames(self._live.session, frames)

    def _on_message(self, raw: str | bytes) -> None:
        assert self._live is not None
        if isinstance(raw, bytes):
            self._send(error_message("bad_message", "the events channel takes JSON text messages only"))
            return
        if len(raw.encode()) > self.max_message_bytes:
            limit = self.max_message_bytes
            self._send(error_message("message_too_large", f"a message is limited to {limit} bytes"))
            return
        try:
            message = parse_client_message(raw)
        except ProtocolError as error:
            self._send(error_message(error.code, error.message))
            return
        if isinstance(message, InputText):
            self._start(self._live.session.push_text(message.text))
        elif isinstance(message, SessionEnd):
            self.end()
        else:
            self._send(error_message("already_started", "over WebRTC the session starts with the offer"))

    # ----- out -----------------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        channel = self._channel
        if channel is None or channel.readyState == "connecting":
            self._unsent.append(message)
        elif channel.readyState == "open":
            channel.send(json.dumps(message))

    def _played(self, turn: int, samples: int) -> None:
        if self._live is not None:
            self._live.session.audio_played(turn, samples)


class TrackSink:
    """WebRTC: the events on the data channel (`send`), the agent's voice into the outbound track, whose
    queue a barge-in flushes."""

    def __init__(self, track: OutboundAudioTrack, send: Callable[[dict[str, Any]], None]) -> None:
        self.track, self.send = track, send

    async def send_message(self, message: dict[str, Any]) -> None:
        self.send(message)

    async def send_audio(self, chunk: OutChunk) -> None:
        self.track.push(chunk.turn, chunk.samples)

    async def flush_audio(self, turn: int) -> None:
        self.track.flush()
