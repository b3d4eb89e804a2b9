"""One thread for every forward pass in the process, whichever thread asks for it.

torch's CPU wheel runs its parallel regions on GNU OpenMP (libgomp), which gives each thread that starts a
parallel region a team of worker threads of its own, kept for that thread's life. The voice agent used
to compute on many threads: the engine loaded on one, prefills and end-of-turn scores on the event loop's
executor (up to six threads), each reply on a thread of its own. In a voice session its forwards then ran
slower than the same forwards from one thread: the 0.5B draft's step 24-27 against 15-19 ms p50, a score
30-32 against 18-22, a plain target step 57-61 against 50-54 (`python -m voiceagent bench`, three rounds,
Intel Xeon model 167, 2 cores, torch 2.13.0; bench/results/2026-12-07-cpu-xeon-amx-167-engine-thread.md).
Outside a session, forwards from a second and a third thread cost the same as from the first, so which
of the session's threads and teams causes it is not pinned down; one thread for all of it removes it.

So the engine's entry points that compute (loading, calibration, a conversation's caches, prefill,
end-of-turn scores, forks and each block of a generation) hand their work to `ENGINE_THREAD` and wait for
it; a call made on that thread runs at once. Callers keep their own threads and turn-taking; only the
computing moves. The hand-over costs tens of microseconds a call, a fraction of a percent of a block.
Other PyTorch work in a process with an engine (a benchmark's transformers contender) belongs on this
thread too.
"""

from __future__ import annotations

import atexit
import functools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import ParamSpec, TypeVar

__all__ = ["ENGINE_THREAD", "EngineThread", "on_engine_thread"]

STOP_TIMEOUT_S = 10.0  # at exit, the longest the process waits for a call in flight (one block, a load)
Result = TypeVar("Result")
Item = TypeVar("Item")
Params = ParamSpec("Params")
Handed = tuple[Future[object], Callable[[], object]]  # a call and the future its outcome goes to


class EngineThread:
    """A daemon thread that runs the calls handed to it one at a time, in the order they came."""

    def __init__(self, name: str = "engine") -> None:
        self.name = name
        self._calls: queue.SimpleQueue[Handed | None] = queue.SimpleQueue()  # None: stop
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        self._unfinished = 0  # calls handed over and not yet finished (queued or running)

    def run(self, call: Callable[Params, Result], *args: Params.args, **kwargs: Params.kwargs) -> Result:
        """`call(*args, **kwargs)` on the engine thread; its result, or its exception raised here."""
        if self.is_current():
            return call(*args, **kwargs)
        return self.submit(call, *args, **kwargs).result()

    def submit(
        self, call: Callable[Params, Result], *args: Params.args, **kwargs: Params.kwargs
    ) -> Future[Result]:
        """Queues `call(*args, **kwargs)` behind the calls handed over before it; returns its future."""
        future: Future[Result] = Future()
        with self._starting:
            self._unfinished += 1
        self._calls.put((future, functools.partial(call, *args, **kwargs)))  # type: ignore[arg-type]
        self._ensure_started()
        return future

    def idle(self) -> bool:
        """No call is queued or running."""
        return self._unfinished == 0

    def is_current(self) -> bool:
        """Whether this is the engine thread."""
        return threading.current_thread() is self._thread

    def iterate(self, items: Iterator[Item]) -> Iterator[Item]:
        """`items`, each item made on the engine thread (e.g. a generation's blocks)."""
        return _OnThread(self, items)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Ends the thread once the calls handed over before have run (waits up to `timeout_s`); a later
        call starts a new one. Called at exit, before the interpreter finalizes: a daemon thread that frees
        a tensor then aborts the process ('terminate called without an active exception')."""
        with self._starting:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._calls.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._starting:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while (handed := self._calls.get()) is not None:
            self._run_one(*handed)
            del handed  # a finished call's arguments (a conversation, its caches) are not kept alive here
            with self._starting:
                self._unfinished -= 1

    @staticmethod
    def _run_one(future: Future[object], call: Callable[[], object]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = call()
        except BaseException as error:  # noqa: BLE001 - handed to the caller, the thread goes on
            future.set_exception(error)
        else:
            future.set_result(result)


class _OnThread(Iterator[Item]):
    def __init__(self, thread: EngineThread, items: Iterator[Item]) -> None:
        self._thread, self._items = thread, items

    def __next__(self) -> Item:
        item = self._thread.run(next, self._items, _END)
        if item is _END:
            raise StopIteration
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Closes the underlying generator (its `finally` blocks run on the engine thread)."""
        close = getattr(self._items, "close", None)
        if close is not None:
            self._thread.run(close)


_END = object()

# The process's engine thread: every Engine's computing runs here (see the module docstring).
ENGINE_THREAD = EngineThread()
atexit.register(ENGINE_THREAD.stop)


def on_engine_thread(method: Callable[Params, Result]) -> Callable[Params, Result]:
    """A function or method whose body runs on `ENGINE_THREAD`, whichever thread calls it."""

    @functools.wraps(method)
    def wrapper(*args: Params.args, **kwargs: Params.kwargs) -> Result:
        return ENGINE_THREAD.run(method, *args, **kwargs)

    return wrapper
