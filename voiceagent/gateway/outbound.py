"""A session's events out to one client, on every transport (/ws, WebRTC, Twilio).

`Outbound` turns the session's voice into paced audio (a `Playout`) and its events into the /ws JSON
events (docs/protocol.md, built in ws_protocol.py), frames the audio with `agent.audio.start` /
`agent.audio.end`, ends each turn once for the hub (`finish_turn`, sent as `turn.metrics`), and at a
barge-in drops the queued audio and says `interrupted`. The transport gives an `OutboundSink`: where an
audio chunk goes (binary PCM16 on /ws, the outbound track on WebRTC, `media` and a `mark` on Twilio),
what a barge-in drops that was already handed over (the track's queue on WebRTC, Twilio's buffer with
`clear`; nothing on /ws, whose client flushes at `interrupted`), and where the JSON events go (the socket
on /ws, the data channel on WebRTC; Twilio has no such channel and drops them). Played samples come from
the playout's clock on /ws (`on_played`), from the track on WebRTC and from returned marks on Twilio.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from voiceagent.clock import Clock
from voiceagent.events import Event, Interrupted, ReplyPaused, ReplyResumed, SpeechAudio, TurnEnded, TurnError
from voiceagent.gateway.hub import LiveSession
from voiceagent.gateway.playout import OutChunk, Playout
from voiceagent.gateway.ws_protocol import (
    audio_end_message,
    audio_start_message,
    event_message,
    turn_metrics_message,
)


class OutboundSink(Protocol):
    """One transport's way to its client (see the module docstring)."""

    async def send_message(self, message: dict[str, Any]) -> None:
        """A /ws JSON event."""

    async def send_audio(self, chunk: OutChunk) -> None:
        """A chunk of the agent's voice, at the time the playout allows."""

    async def flush_audio(self, turn: int) -> None:
        """A barge-in on `turn`: drop what was handed over and not yet played."""


class Outbound:
    """Session events -> paced audio and JSON events through one transport's sink."""

    def __init__(
        self,
        live: LiveSession,
        clock: Clock,
        rate: int,
        sink: OutboundSink,
        *,
        lead_ms: int,
        chunk_ms: int = 20,
        on_played: Callable[[int, int], None] | None = None,
    ) -> None:
        self.live, self.rate, self.sink = live, rate, sink
        send, turn_sent = self._send_chunk, self._turn_sent
        self.playout = Playout(
            clock, rate, send, turn_sent, chunk_ms=chunk_ms, lead_ms=lead_ms, on_played=on_played
        )
        self._audio_open: set[int] = set()  # turns between agent.audio.start and agent.audio.end

    @contextlib.asynccontextmanager
    async def sending(self, on_failure: Callable[[BaseException], None]) -> AsyncIterator[None]:
        """Runs the event pump and the playout while the block runs; `on_failure(error)` is called when
        either fails (the transport then ends its connection), and the failure is raised at the end."""

        def done(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and (error := task.exception()) is not None:
                on_failure(error)

        tasks = [asyncio.create_task(self.pump()), asyncio.create_task(self.playout.run())]
        for task in tasks:
            task.add_done_callback(done)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def pump(self) -> None:
        async for event in self.live.events():
            await self.dispatch(event)

    async def dispatch(self, event: Event) -> None:
        turn = event.turn_id
        if isinstance(event, SpeechAudio):
            self.playout.push(event)
        elif isinstance(event, TurnEnded):
            self.playout.end_turn(turn, event.reason)
        elif isinstance(event, TurnError):
            await self._send_event(event)
            self.playout.end_turn(turn, "error")
        elif isinstance(event, ReplyPaused | ReplyResumed):
            (self.playout.pause if isinstance(event, ReplyPaused) else self.playout.resume)(turn)
            await self._send_event(event)
        elif isinstance(event, Interrupted):
            self.playout.resume(turn)
            self.playout.clear()
            await self.sink.flush_audio(turn)
            await self._audio_end(turn, interrupted=True)
            await self._send_event(event)
            await self._finish_turn(turn, "interrupted")
        else:
            await self._send_event(event)

    async def _send_event(self, event: Event) -> None:
        if (message := event_message(event)) is not None:
            await self.sink.send_message(message)

    async def _send_chunk(self, chunk: OutChunk) -> None:
        if chunk.first_of_turn:
            self._audio_open.add(chunk.turn)
            await self.sink.send_message(audio_start_message(chunk.turn, self.rate))
        if chunk.first_of_source:
            self.live.session.audio_sent(chunk.source)
        await self.sink.send_audio(chunk)

    async def _turn_sent(self, turn: int, outcome: str) -> None:
        await self._audio_end(turn)
        await self._finish_turn(turn, outcome)

    async def _audio_end(self, turn: int, interrupted: bool = False) -> None:
        if turn in self._audio_open:
            self._audio_open.discard(turn)
            samples = self.playout.sent_samples(turn)
            await self.sink.send_message(audio_end_message(turn, samples, interrupted))

    async def _finish_turn(self, turn: int, outcome: str) -> None:
        if (metrics := self.live.finish_turn(turn, outcome)) is not None:
            await self.sink.send_message(turn_metrics_message(metrics))
