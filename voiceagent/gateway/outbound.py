"""A session's events out to a client that speaks the /ws events (docs/protocol.md): `/ws` and WebRTC.

`Outbound` turns the session's events into JSON messages and its voice into paced audio (a `Playout`),
and frames the audio with `agent.audio.start` / `agent.audio.end`, ending each turn with `turn.metrics`.
The transport supplies how a message is sent (`send_message`), where an audio chunk goes (`send_audio`:
binary on /ws, the outbound track on WebRTC), and, optionally, what drops audio already handed over at
a barge-in (`flush_audio`) and what reports played samples (`on_played`: the playout's clock on /ws; the
track reports them itself on WebRTC). Twilio's marks and `clear` differ enough to have their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from voiceagent.clock import Clock
from voiceagent.events import Event, Interrupted, SpeechAudio, TurnEnded, TurnError
from voiceagent.gateway.hub import LiveSession
from voiceagent.gateway.playout import OutChunk, Playout
from voiceagent.gateway.ws_protocol import error_message, event_message


class Outbound:
    """Session events -> JSON events and paced audio for one client (see the module docstring)."""

    def __init__(
        self,
        live: LiveSession,
        clock: Clock,
        rate: int,
        send_message: Callable[[dict[str, Any]], Awaitable[None]],
        send_audio: Callable[[OutChunk], Awaitable[None]],
        *,
        lead_ms: int,
        on_played: Callable[[int, int], None] | None = None,
        flush_audio: Callable[[], None] | None = None,
    ) -> None:
        self.live, self.rate = live, rate
        self.send_message, self.send_audio, self.flush_audio = send_message, send_audio, flush_audio
        self.playout = Playout(
            clock, rate, self._send_chunk, self._turn_sent, lead_ms=lead_ms, on_played=on_played
        )
        self._audio_open: set[int] = set()  # turns between agent.audio.start and agent.audio.end

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
            await self.send_message(error_message(event.code, event.message, stage=event.stage, turn=turn))
            self.playout.end_turn(turn, "error")
        elif isinstance(event, Interrupted):
            self.playout.clear()
            if self.flush_audio is not None:
                self.flush_audio()
            await self._audio_end(turn, interrupted=True)
            await self.send_message({"type": "interrupted", "turn": turn, "spoken_text": event.spoken_text})
            await self._metrics(turn, "interrupted")
        elif (message := event_message(event)) is not None:
            await self.send_message(message)

    async def _send_chunk(self, chunk: OutChunk) -> None:
        if chunk.first_of_turn:
            self._audio_open.add(chunk.turn)
            await self.send_message(
                {"type": "agent.audio.start", "turn": chunk.turn, "sample_rate": self.rate}
            )
        if chunk.first_of_source:
            self.live.session.audio_sent(chunk.source)
        await self.send_audio(chunk)

    async def _turn_sent(self, turn: int, outcome: str) -> None:
        await self._audio_end(turn)
        await self._metrics(turn, outcome)

    async def _audio_end(self, turn: int, interrupted: bool = False) -> None:
        if turn in self._audio_open:
            self._audio_open.discard(turn)
            samples = self.playout.sent_samples(turn)
            await self.send_message(
                {"type": "agent.audio.end", "turn": turn, "samples": samples, "interrupted": interrupted}
            )

    async def _metrics(self, turn: int, outcome: str) -> None:
        if (payload := self.live.finish_turn(turn, outcome)) is not None:
            await self.send_message({"type": "turn.metrics", **payload})
