"""Speech before the engine on a small CPU: the engine's next forward waits while ASR or TTS computes.

On a CPU the engine's forward passes (llama.cpp's or PyTorch's) use every core, and their threads meet at a
barrier after each of a forward's few hundred operations. A recogniser's decode or a Piper phrase run beside
them takes a core away at random moments, and every barrier then waits for the thread that lost its core:
on 2 AVX2 cores a decoding step went from 91 to 221 ms/token while Piper rendered beside it, and Piper's
first audio from 81 ms (alone, 2 threads) to 193 ms (1 thread, beside the engine). Taking turns costs less
than sharing.

A speech job (a partial or final transcript, a phrase's audio) is what the user waits for, and it is short;
an engine forward may be long (a prefill of a few ids: 55-150 ms on 2 cores). So speech jobs never wait:
they start at once, and the engine waits before its next forward (a block, a prefill, a score) until the
jobs running when it asked have ended (jobs begun meanwhile do not lengthen the wait, so many sessions'
jobs cannot starve it). A forward in flight when a job begins holds at its next layer (`pause_point`, run
between the layers of the engine's PyTorch models: `Engine.pause_between_layers`) until that job ends: the
job shares the cores with at most one layer (~2-5 ms). Each job holds the engine once at most, for at most
MAX_ENGINE_WAIT_S, so a stuck synthesiser cannot stall a forward layer after layer. The engine loses at
most the jobs' own time.

Where the LLM is a local engine on the CPU, the pipeline has one `CpuLane` for its engine; with a remote LLM
or an engine on a GPU there is none (`NO_LANE`): nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["MAX_ENGINE_WAIT_S", "NO_LANE", "CpuLane"]

MAX_ENGINE_WAIT_S = 2.0  # the longest the engine waits for speech jobs (a stuck TTS cannot stall a reply)
SETTLE_HOPS = 6  # event-loop turns from a block's hand-over to its phrase's TTS job (4 at most, counted)
SETTLE_S = 0.02  # the longest the engine waits for them

Result = TypeVar("Result")
Item = TypeVar("Item")


class CpuLane:
    """Speech jobs first, the engine's forwards between them. Thread-safe; `active` False: nothing waits."""

    def __init__(self, active: bool = True) -> None:
        self.active = active
        self._idle = threading.Condition()
        self._running: set[int] = set()  # the tickets of the speech jobs computing now
        self._tickets = itertools.count(1)
        self._waited_through = 0  # the engine has waited for every job up to this ticket

    def begin(self) -> int:
        """A speech job starts: returns its ticket, for `end` once it is done. From now on the engine's next
        forward waits for it. Call it where the job is decided, before handing it to a worker thread."""
        if not self.active:
            return 0
        with self._idle:
            ticket = next(self._tickets)
            self._running.add(ticket)
            return ticket

    def end(self, ticket: int) -> None:
        if self.active:
            with self._idle:
                self._running.discard(ticket)
                self._idle.notify_all()

    def run(self, call: Callable[[], Result]) -> Result:
        """`call()`, as a speech job: it starts at once, and the engine's next forward waits for its end."""
        return self.run_begun(self.begin(), call)

    def run_begun(self, ticket: int, call: Callable[[], Result]) -> Result:
        """`call()`, as the speech job begun with `ticket` (in a worker thread)."""
        try:
            return call()
        finally:
            self.end(ticket)

    def next_of(self, ticket: int, items: Iterator[Item]) -> Item | None:
        """The iterator's next item (None at its end), as the job begun with `ticket`: a synthesizer
        renders in `next`."""
        return self.run_begun(ticket, lambda: next(items, None))

    def wait_turn(self, timeout_s: float = MAX_ENGINE_WAIT_S) -> None:
        """Called by the engine before a forward: returns once the speech jobs running now have ended (or
        after `timeout_s`). Jobs begun meanwhile do not lengthen the wait: with many sessions' jobs
        overlapping, the engine still makes a forward after the longest one."""
        if not self.active:
            return
        with self._idle:
            waiting_for = set(self._running)
            self._waited_through = max(waiting_for, default=self._waited_through)
            self._idle.wait_for(lambda: not waiting_for & self._running, timeout_s)

    def pause_point(self) -> None:
        """Called by the engine between a forward's layers: returns at once unless a speech job has begun
        since the engine last waited; then once those jobs have ended (or after MAX_ENGINE_WAIT_S)."""
        if not self._running:  # the usual case, without the lock: a job begun just now is seen next layer
            return
        with self._idle:
            new = {ticket for ticket in self._running if ticket > self._waited_through}
            if not new:
                return
            self._waited_through = max(new)
            self._idle.wait_for(lambda: not new & self._running, MAX_ENGINE_WAIT_S)

    def settle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called by the engine's worker thread after handing a block to `loop`: returns once the loop has
        run what that block set going (the reply's chunker, then the `begin` of a phrase's TTS: a few
        callbacks deep) or after SETTLE_S, so that job is begun before the engine's next forward."""
        if not self.active or loop.is_closed():
            return
        with contextlib.suppress(TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(_yield_to(SETTLE_HOPS), loop).result(SETTLE_S)

    async def in_thread(self, call: Callable[..., Result], *args: object) -> Result:
        """`call(*args)` in a worker thread, as a speech job begun now."""
        ticket = self.begin()
        return await asyncio.to_thread(self.run_begun, ticket, functools.partial(call, *args))

    def busy(self) -> bool:
        """A speech job is computing now."""
        return bool(self._running)


async def _yield_to(hops: int) -> None:
    for _ in range(hops):
        await asyncio.sleep(0)


NO_LANE = CpuLane(active=False)
