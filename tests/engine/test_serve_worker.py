"""The server's scheduler on a tiny random engine: arrival order, a bounded queue, cancellation, failures."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from engine.generate import CommittedBlock
from engine.sampling import SamplingParams
from engine.server.metrics import ServerMetrics
from engine.server.worker import EngineWorker, Job, JobEvent, JobFailed, QueueFull
from tests.fakes import tiny_engine

PARAMS = SamplingParams(max_new_tokens=6, ignore_eos=True)


class Recorder:
    """A job's `deliver`: keeps the events; optionally holds the worker at the first block until released."""

    def __init__(self, hold: bool = False) -> None:
        self.events: list[JobEvent] = []
        self.done = threading.Event()
        self.started = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def __call__(self, event: JobEvent) -> None:
        self.started.set()
        self.release.wait(10)
        self.events.append(event)
        if isinstance(event, JobFailed) or event.finish_reason is not None:
            self.done.set()

    def blocks(self) -> list[CommittedBlock]:
        return [event for event in self.events if isinstance(event, CommittedBlock)]


@pytest.fixture
def worker() -> Iterator[EngineWorker]:
    metrics = ServerMetrics("tiny", 4)
    clock = iter(range(10**6)).__next__  # a fake clock: one tick per reading
    running = EngineWorker(tiny_engine(), metrics, max_waiting=2, clock=lambda: float(clock()))
    running.start()
    yield running
    running.stop()


def job(deliver: Recorder, prompt: list[int] | None = None) -> Job:
    return Job(prompt or [1, 2, 3], PARAMS, deliver, arrived=0.0)


def sample(worker: EngineWorker, name: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(name, {"model_name": "tiny", "engine": "0", **labels})
    assert value is not None, name
    return value


def test_jobs_run_in_arrival_order_and_the_queue_is_bounded(worker: EngineWorker) -> None:
    first = Recorder(hold=True)
    worker.submit(job(first))
    assert first.started.wait(10)  # the worker is busy with the first job
    waiting = [Recorder(), Recorder()]
    for recorder in waiting:
        worker.submit(job(recorder))
    with pytest.raises(QueueFull, match="2 are already waiting"):
        worker.submit(job(Recorder()))
    assert (
        sample(worker, "vllm:num_requests_waiting") == 2 and sample(worker, "vllm:num_requests_running") == 1
    )
    first.release.set()
    for recorder in [first, *waiting]:
        assert recorder.done.wait(10)
        assert sum(len(block.token_ids) for block in recorder.blocks()) == 6
    assert first.done.is_set() and min(b.timing.committed_at for b in waiting[0].blocks()) > max(
        b.timing.committed_at for b in first.blocks()
    )
    assert sample(worker, "vllm:request_success_total", finished_reason="length") == 3


def test_a_job_cancelled_while_waiting_never_runs(worker: EngineWorker) -> None:
    first, second = Recorder(hold=True), Recorder()
    worker.submit(job(first))
    assert first.started.wait(10)
    cancelled = job(second)
    worker.submit(cancelled)
    cancelled.cancel.set()  # the client left while it waited
    first.release.set()
    assert second.done.wait(10)
    assert second.events == [JobFailed("the request was cancelled before it started")]
    assert sample(worker, "vllm:request_success_total", finished_reason="abort") == 1


def test_cancel_stops_a_running_job_at_the_next_block(worker: EngineWorker) -> None:
    running = Recorder(hold=True)
    long_job = Job([1, 2, 3], SamplingParams(max_new_tokens=200, ignore_eos=True), running, arrived=0.0)
    worker.submit(long_job)
    assert running.started.wait(10)
    long_job.cancel.set()
    running.release.set()
    assert running.done.wait(10)
    blocks = running.blocks()
    assert blocks[-1].finish_reason == "cancelled" and sum(len(b.token_ids) for b in blocks) <= 10


def test_an_engine_failure_fails_the_job_not_the_worker(worker: EngineWorker) -> None:
    broken = Recorder()
    worker.submit(job(broken, prompt=[1, 10**6]))  # past the server's checks, the engine refuses it
    assert broken.done.wait(10)
    assert (
        isinstance(broken.events[0], JobFailed) and "prompt ids must be integers" in broken.events[0].message
    )
    healthy = Recorder()
    worker.submit(job(healthy))
    assert healthy.done.wait(10) and healthy.blocks()[-1].finish_reason == "length"
    assert sample(worker, "vllm:request_success_total", finished_reason="error") == 1


def test_stop_cancels_the_running_job_and_fails_the_waiting_ones() -> None:
    worker = EngineWorker(tiny_engine(), ServerMetrics("tiny", None), max_waiting=4, clock=lambda: 0.0)
    worker.start()
    running, waiting = Recorder(hold=True), Recorder()
    long_job = Job([1, 2], SamplingParams(max_new_tokens=200, ignore_eos=True), running, arrived=0.0)
    worker.submit(long_job)
    assert running.started.wait(10)
    worker.submit(job(waiting))
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    running.release.set()
    stopper.join(10)
    assert not worker.alive
    assert waiting.events == [JobFailed("the server is shutting down")]
    assert running.blocks()[-1].finish_reason == "cancelled"


def test_queue_length_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="queue length must be >= 0"):
        EngineWorker(tiny_engine(), ServerMetrics("tiny", None), max_waiting=-1, clock=lambda: 0.0)
