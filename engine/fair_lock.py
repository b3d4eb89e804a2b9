"""The engine's lock: forward passes on one engine, from any of its conversations, one at a time, FIFO.

The engine is batch 1, so two conversations cannot step at once; they take turns block by block. A thread
that steps a generation (the server's worker) takes the one `Engine.lock` for each block, so threads
stepping one engine queue fairly for it whoever started them. The computing itself runs on the engine
thread (engine/engine_thread.py), whose queue is first come, first served too: `voiceagent`'s LocalLLMs
hand it one job a block and take no lock (a job on that thread must never wait for a lock held by a
thread waiting for that thread).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import TypeVar

Item = TypeVar("Item")


class FairLock:
    """A lock granted in the order it was asked for (FIFO): a release hands it straight to the longest
    waiter. A plain threading.Lock is not fair: a thread that releases and at once asks again (a
    conversation stepping block after block) often wins it back before a waiting thread wakes up, so a
    reply can take several blocks in a row (at worst all of them) while another conversation waits."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()  # each held until its turn comes
        self._held = False

    def acquire(self) -> None:
        with self._guard:
            if not self._held:
                self._held = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        turn.acquire()  # released by the holder's release(): the lock is ours, still marked held

    def release(self) -> None:
        with self._guard:
            if not self._held:
                raise RuntimeError("release of an unheld FairLock")
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._held = False

    def locked(self) -> bool:
        return self._held

    def waiting(self) -> int:
        """Threads waiting for the lock now."""
        return len(self._waiters)

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def each(self, items: Iterator[Item]) -> Iterator[Item]:
        """The items of `items` (e.g. a generation's committed blocks), each made under the lock; it is
        released between them, so the consumer of one block never holds the engine from the others."""
        while True:
            with self:
                try:
                    item = next(items)
                except StopIteration:
                    return
            yield item
