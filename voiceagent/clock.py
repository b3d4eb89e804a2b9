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
