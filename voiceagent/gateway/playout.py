"""The agent's audio out to a socket in real time: at most `lead_ms` ahead of what the listener has heard.

The reply's `SpeechAudio` events are cut into chunks of `chunk_ms` and handed to `send` no faster than
they play, so a barge-in has little to flush and the transport's buffers stay small. The playout keeps a
model of the listener's playback (each chunk plays after the one before, and not before it was sent):

- With `on_played`, that model is the output clock: as each chunk's play time passes, the turn's played
  samples are reported (the WebSocket API; the session uses them to cut the history at a barge-in).
  Transports with real confirmations (Twilio's marks) leave it out and report those instead.
- `end_turn(turn, outcome)` says the turn's audio is complete: `on_turn_sent(turn, outcome)` runs once
  its last chunk went out (at once if it had none).
- `clear()` drops everything queued and forgets the playback model (the listener flushes its buffer).
- `pause(turn)` stops sending the turn's audio (what was sent, at most `lead_ms`, still plays) until
  `resume(turn)`: the user spoke over the reply, and it goes on if they said no real words.

Time comes from the injected clock only; on a fake clock the playout runs as fast as it is awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from voiceagent.clock import Clock
from voiceagent.events import SpeechAudio


@dataclass(frozen=True, eq=False)
class OutChunk:
    turn: int
    samples: np.ndarray  # [n] int16 at the session's output rate
    end_sample: int  # the turn's samples sent once this chunk is out
    source: SpeechAudio
    first_of_source: bool
    first_of_turn: bool


class Playout:
    def __init__(
        self,
        clock: Clock,
        rate: int,
        send: Callable[[OutChunk], Awaitable[None]],
        on_turn_sent: Callable[[int, str], Awaitable[None]],
        *,
        chunk_ms: int = 20,
        lead_ms: int = 100,
        on_played: Callable[[int, int], None] | None = None,
    ) -> None:
        self.clock, self.rate, self.send, self.on_turn_sent = clock, rate, send, on_turn_sent
        self.on_played = on_played
        self.chunk_samples = rate * chunk_ms // 1000
        self.lead_ns = lead_ms * 1_000_000
        self._queue: deque[OutChunk] = deque()
        self._ending: dict[int, str] = {}  # turn -> outcome, once its audio is complete
        self._sent: dict[int, int] = {}  # turn -> samples sent
        self._playing: deque[tuple[int, int, int]] = deque()  # (play end ns, turn, end_sample) unreported
        self._play_end_ns = 0
        self._paused: set[int] = set()  # turns whose audio waits (pause / resume)
        self._wake = asyncio.Event()

    def push(self, event: SpeechAudio) -> None:
        """Queues the event's audio (it must be at this playout's rate)."""
        if event.sample_rate != self.rate:
            raise ValueError(f"playout at {self.rate} Hz got audio at {event.sample_rate} Hz")
        queued = self._queued_end(event.turn_id)
        for start in range(0, len(event.samples), self.chunk_samples):
            samples = event.samples[start : start + self.chunk_samples]
            queued += len(samples)
            first_of_turn = queued == len(samples) and event.turn_id not in self._sent
            self._queue.append(OutChunk(event.turn_id, samples, queued, event, start == 0, first_of_turn))
        self._wake.set()

    def end_turn(self, turn: int, outcome: str) -> None:
        self._ending.setdefault(turn, outcome)
        self._wake.set()

    def clear(self) -> set[int]:
        """Drops all queued audio and unplayed reports; returns the turns that had audio sent or queued."""
        turns = {chunk.turn for chunk in self._queue} | {turn for _, turn, _ in self._playing}
        self._queue.clear()
        self._playing.clear()
        self._play_end_ns = 0
        for turn in turns:
            self._ending.pop(turn, None)
        self._wake.set()
        return turns

    def pause(self, turn: int) -> None:
        self._paused.add(turn)

    def resume(self, turn: int) -> None:
        self._paused.discard(turn)
        self._wake.set()

    def _sendable(self) -> bool:
        return bool(self._queue) and self._queue[0].turn not in self._paused

    def sent_samples(self, turn: int) -> int:
        return self._sent.get(turn, 0)

    async def run(self) -> None:
        """Sends until cancelled."""
        while True:
            now = self.clock.now_ns()
            self._report_played(now)
            if self._sendable() and now >= self._play_end_ns - self.lead_ns:
                await self._send_next(now)
                continue
            if (done := self._turn_done()) is not None:
                await self.on_turn_sent(*done)
                continue
            await self._wait(self._next_deadline(now))

    def _queued_end(self, turn: int) -> int:
        for chunk in reversed(self._queue):
            if chunk.turn == turn:
                return chunk.end_sample
        return self._sent.get(turn, 0)

    async def _send_next(self, now: int) -> None:
        chunk = self._queue.popleft()
        self._sent[chunk.turn] = chunk.end_sample
        self._play_end_ns = max(now, self._play_end_ns) + len(chunk.samples) * 1_000_000_000 // self.rate
        if self.on_played is not None:
            self._playing.append((self._play_end_ns, chunk.turn, chunk.end_sample))
        await self.send(chunk)

    def _turn_done(self) -> tuple[int, str] | None:
        queued_turns = {chunk.turn for chunk in self._queue}
        for turn, outcome in self._ending.items():
            if turn not in queued_turns:
                del self._ending[turn]
                return turn, outcome
        return None

    def _report_played(self, now: int) -> None:
        if self.on_played is None:
            return
        latest: dict[int, int] = {}
        while self._playing and self._playing[0][0] <= now:
            _, turn, end_sample = self._playing.popleft()
            latest[turn] = end_sample
        for turn, samples in latest.items():
            self.on_played(turn, samples)

    def _next_deadline(self, now: int) -> int | None:
        deadlines = []
        if self._sendable():
            deadlines.append(self._play_end_ns - self.lead_ns)
        if self._playing:
            deadlines.append(self._playing[0][0])
        return min(deadlines) if deadlines else None

    async def _wait(self, deadline_ns: int | None) -> None:
        """Until `deadline_ns` (clock time) or something new arrives, whichever is first."""
        self._wake.clear()
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._wake.wait())]
        if deadline_ns is not None:
            waits.append(asyncio.ensure_future(self.clock.sleep((deadline_ns - self.clock.now_ns()) / 1e9)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Awaiting a cancelled helper raises its CancelledError, suppressed here; a cancellation of
            # this task that arrives meanwhile surfaces as that same error, so it is re-raised when one
            # was requested during the awaits (otherwise `run()` would carry on and never end).
            task = asyncio.current_task()
            cancels = task.cancelling() if task is not None else 0
            for wait in waits:
                wait.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await wait
            if task is not None and task.cancelling() > cancels:
                raise asyncio.CancelledError
