"""Time for the voice pipeline, injected: nothing else in `voiceagent` reads a clock or sleeps directly.

`MonotonicClock` is the real one. Tests use `tests.fakes.FakeClock`, where sleeping advances time at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int:
        """Monotonic nanoseconds (the `t_ns` of every event)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Waits `seconds` (pacing audio in real time)."""
        ...


class MonotonicClock:
    def now_ns(self) -> int:
        return time.monotonic_ns()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FastForwardClock:
    """Real time, except that sleeping jumps the clock ahead at once instead of waiting.

    Replays a recording faster than real time while every timestamp stays consistent: work still takes
    its real time, only the idle waits (pacing input frames, playing audio) are skipped.
    """

    def __init__(self) -> None:
        self._skipped_ns = 0

    def now_ns(self) -> int:
        return time.monotonic_ns() + self._skipped_ns

    async def sleep(self, seconds: float) -> None:
        self._skipped_ns += int(max(0.0, seconds) * 1e9)
        await asyncio.sleep(0)
