"""The sessions of one gateway process: the cap every transport shares, and the metrics they feed.

A transport (/ws, /twilio, WebRTC) opens its voice session through `SessionHub.open`:

    async with hub.open("webrtc", SessionOptions(output_rate=48000)) as live:   # SessionLimitError if full
        await live.session.push_audio(frame, t_ns)
        async for event in live.events():   # the session's events; blocks are counted for /metrics
            ...
        payload = live.finish_turn(turn, "done")   # once per turn: latencies -> histograms, turn.metrics

Beyond `max_sessions` live sessions `open` raises `SessionLimitError` at once (never queues): the transport
tells the client (close code 1013 with the reason). Sessions get the turn length limit (max_turn_s) here;
each transport ends a session at `session_limit_s` (VOICEAGENT_MAX_SESSION_S) itself. Leaving the block
closes the session, its LLM conversation and its trace, and frees the slot, whatever way the transport
ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from voiceagent.clock import Clock
from voiceagent.config import Settings
from voiceagent.events import Event, ReplyText
from voiceagent.gateway.metrics import GatewayMetrics
from voiceagent.session import Session, SessionOptions
from voiceagent.trace import Trace, TurnTimes
from voiceagent.traced import PipelineLike, new_session_id, traced_session

__all__ = ["LiveSession", "PipelineLike", "SessionHub", "SessionLimitError"]


class SessionLimitError(RuntimeError):
    """The session cap is reached; the message says so in words a client can show."""


@dataclass
class _TurnCounts:
    blocks: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class LiveSession:
    id: str
    transport: str
    session: Session
    trace: Trace
    times: TurnTimes  # fed by the trace as it is written (see voiceagent/traced.py)
    metrics: GatewayMetrics
    _counts: dict[int, _TurnCounts] = field(default_factory=dict)
    _finished: set[int] = field(default_factory=set)

    async def events(self) -> AsyncIterator[Event]:
        """The session's events (see `Session.events`), with committed blocks counted on the way."""
        async for event in self.session.events():
            if isinstance(event, ReplyText):
                counts = self._counts.setdefault(event.turn_id, _TurnCounts())
                counts.blocks += 1
                counts.drafted += event.n_drafted or 0
                counts.accepted += event.n_accepted or 0
                self.metrics.observe_block(event.n_drafted, event.n_accepted)
            yield event

    def finish_turn(self, turn: int, outcome: str) -> dict[str, Any] | None:
        """The turn is over for the transport (outcome: done | interrupted | error): records its metrics
        once and returns them (None when already recorded)."""
        if turn in self._finished:
            return None
        self._finished.add(turn)
        typed = self.times.typed(turn)
        # A typed message has no end of speech: its latencies count from its arrival (asr_final is 0).
        latency_ms = self.times.latencies_from_typing_ms(turn) if typed else self.times.latencies_ms(turn)
        # The latency histograms are voice to voice: typed turns are counted but not timed there.
        self.metrics.observe_turn(self.transport, outcome, {} if typed else latency_ms)
        counts = self._counts.pop(turn, _TurnCounts())
        rate = counts.accepted / counts.drafted if counts.drafted else None
        return {
            "turn": turn,
            "outcome": outcome,
            "input": "text" if typed else "speech",
            "latency_ms": latency_ms,
            "blocks": counts.blocks,
            "n_drafted": counts.drafted,
            "n_accepted": counts.accepted,
            "acceptance_rate": rate,
        }


class SessionHub:
    """Creates sessions on the shared pipeline, up to `settings.max_sessions` at once."""

    def __init__(
        self, pipeline: PipelineLike, settings: Settings, metrics: GatewayMetrics, clock: Clock
    ) -> None:
        self.pipeline, self.settings, self.metrics, self.clock = pipeline, settings, metrics, clock
        self.live: dict[str, LiveSession] = {}

    @property
    def session_limit_s(self) -> float:
        return self.settings.max_session_s

    async def within_session_limit(self, serving: Awaitable[None]) -> bool:
        """Awaits a transport's `serving` of its session; False when `session_limit_s` cut it off (the
        transport then tells its client why). Any other timeout inside is passed on."""
        limit = asyncio.timeout(self.session_limit_s)
        try:
            async with limit:
                await serving
        except TimeoutError:
            if not limit.expired():
                raise
            return False
        return True

    @property
    def full(self) -> bool:
        return len(self.live) >= self.settings.max_sessions

    @contextlib.asynccontextmanager
    async def open(self, transport: str, options: SessionOptions) -> AsyncIterator[LiveSession]:
        if self.full:
            self.metrics.sessions_refused.labels(transport, "session_limit").inc()
            raise SessionLimitError(
                f"the server is at its limit of {self.settings.max_sessions} sessions; try again later"
            )
        if options.max_turn_s is None:
            options = dataclasses.replace(options, max_turn_s=self.settings.max_turn_s)
        session_id = new_session_id()
        path = None if self.settings.trace_dir is None else self.settings.trace_dir / f"{session_id}.jsonl"
        opened = traced_session(
            self.pipeline,
            transport,
            self.clock,
            options,
            trace_path=path,
            session_id=session_id,
            record_audio=self.settings.record_audio,
        )
        async with opened as traced:
            live = LiveSession(
                session_id, transport, traced.session, traced.trace, traced.times, self.metrics
            )
            self.live[session_id] = live
            self.metrics.sessions.labels(transport).inc()
            self.metrics.sessions_active.labels(transport).inc()
            try:
                yield live
            finally:
                del self.live[session_id]
                self.metrics.sessions_active.labels(transport).dec()
