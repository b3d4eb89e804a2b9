"""The engine's lock is granted first come, first served: conversations queue fairly for the engine."""

from __future__ import annotations

import threading
import time

import pytest

from engine.fair_lock import FairLock
from engine.sampling import SamplingParams
from engine.server.metrics import ServerMetrics
from engine.server.worker import EngineWorker, Job, JobEvent
from tests.fakes import tiny_engine


def wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_waiters_get_the_lock_in_the_order_they_asked() -> None:
    lock, granted = FairLock(), []

    def take(number: int) -> None:
        with lock:
            granted.append(number)

    lock.acquire()
    threads = []
    for number in range(12):
        thread = threading.Thread(target=take, args=(number,))
        thread.start()
        threads.append(thread)
        wait_for(lambda n=number: lock.waiting() == n + 1)  # type: ignore[misc]
    lock.release()
    for thread in threads:
        thread.join(5)
    assert granted == list(range(12))
    assert not lock.locked() and lock.waiting() == 0


def test_a_thread_that_asks_again_at_once_goes_behind_the_waiters() -> None:
    """Two conversations stepping block by block take turns once both are waiting (a plain Lock lets the
    releasing thread win it back, so one reply can hold the engine to its end)."""
    lock, steps = FairLock(), []
    b_waiting = threading.Event()

    def conversation(name: str, n_steps: int) -> None:
        for _ in range(n_steps):
            with lock:
                steps.append(name)
                if name == "A" and len(steps) == 3:
                    b.start()
                    wait_for(lambda: lock.waiting() == 1)
                    b_waiting.set()

    a = threading.Thread(target=conversation, args=("A", 20))
    b = threading.Thread(target=conversation, args=("B", 20))
    a.start()
    a.join(10)
    b.join(10)
    assert b_waiting.is_set() and len(steps) == 40
    first_b = steps.index("B")
    assert first_b == 3  # B asked while A held it: B is next
    # from there on they alternate until A is done, then B finishes alone
    tail = steps[first_b:]
    a_left = steps[first_b:].count("A")
    assert tail[: 2 * a_left] == ["B", "A"] * a_left


def test_release_of_an_unheld_lock_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        FairLock().release()


def test_the_server_worker_makes_its_blocks_under_the_engines_lock() -> None:
    """A job waits while another thread stepping the same engine holds its lock."""
    engine = tiny_engine()
    worker = EngineWorker(engine, ServerMetrics("tiny", 4), max_waiting=2, clock=lambda: 0.0)
    events: list[JobEvent] = []
    done = threading.Event()

    def deliver(event: JobEvent) -> None:
        events.append(event)
        if getattr(event, "finish_reason", None) is not None:
            done.set()

    worker.start()
    try:
        with engine.lock:
            worker.submit(Job([1, 2, 3], SamplingParams(max_new_tokens=6), deliver, arrived=0.0))
            wait_for(lambda: engine.lock.waiting() == 1)
            assert events == []
        assert done.wait(10) and len(events) >= 1
        wait_for(lambda: not engine.lock.locked())  # released once the generation has ended
    finally:
        worker.stop()
