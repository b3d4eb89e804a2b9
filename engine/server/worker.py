"""The server's scheduler: one engine, one request at a time, a bounded first-come-first-served queue.

Batch 1 is the engine's design point, so requests do not share forward passes: they queue. The worker thread
takes them in arrival order and generates each on one long-lived conversation, whose KV cache keeps the
longest common prefix between consecutive prompts (a voice agent re-sends its whole history every turn, so
only the new turn is prefilled). Committed blocks go back to the event loop through `deliver`, which the
request handler provides. A request's `cancel` event is checked by the engine between blocks; a request
cancelled while it waits is dropped without running.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.generate import Clock, CommittedBlock, Engine
from engine.sampling import SamplingParams
from engine.server.metrics import ServerMetrics

log = logging.getLogger("engine.serve")


@dataclass(frozen=True)
class JobFailed:
    """The engine raised while generating; `message` says why."""

    message: str


JobEvent = CommittedBlock | JobFailed


@dataclass
class Job:
    """One request for the engine: prompt ids, sampling, and where its blocks go."""

    prompt_ids: list[int]
    params: SamplingParams
    deliver: Callable[[JobEvent], None]  # called on the worker thread; must be thread-safe and quick
    arrived: float  # engine clock
    cancel: threading.Event = field(default_factory=threading.Event)


class QueueFull(Exception):
    """The bounded queue is full; the request should be refused (HTTP 429)."""


class EngineWorker:
    """Runs jobs one at a time on a worker thread, in arrival order, behind a queue of `max_waiting`."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, *, max_waiting: int, clock: Clock) -> None:
        if max_waiting < 0:
            raise ValueError(f"the queue length must be >= 0, got {max_waiting}")
        self.engine, self.metrics, self.max_waiting, self.clock = engine, metrics, max_waiting, clock
        self._conversation = engine.new_conversation()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._current: Job | None = None
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        metrics.watch_queue(lambda: int(self._current is not None), lambda: self._waiting)

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancels the running job, drops the waiting ones and ends the thread."""
        with self._lock:
            if self._current is not None:
                self._current.cancel.set()
            while not self._jobs.empty():
                job = self._jobs.get_nowait()
                if job is not None:
                    job.cancel.set()
                    job.deliver(JobFailed("the server is shutting down"))
            self._waiting = 0
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, job: Job) -> None:
        """Queues `job`; raises QueueFull when `max_waiting` jobs are already waiting."""
        with self._lock:
            busy = self._current is not None or not self._jobs.empty()
            if busy and self._waiting >= self.max_waiting:
                raise QueueFull(
                    f"the server is busy: it generates one request at a time and {self._waiting} "
                    f"are already waiting (--max-queue-len {self.max_waiting}); retry shortly"
                )
            self._waiting += 1
            self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._current = job
            try:
                self._serve(job)
            finally:
                with self._lock:
                    self._current = None

    def _serve(self, job: Job) -> None:
        started = self.clock()
        self.metrics.request_started(started - job.arrived)
        if job.cancel.is_set():  # the client left while waiting
            self.metrics.request_finished("cancelled", 0, started - job.arrived)
            job.deliver(JobFailed("the request was cancelled before it started"))
            return
        previous, first = started, True
        try:
            blocks = self._conversation.generate(job.prompt_ids, job.params, cancel=job.cancel)
            for block in self.engine.lock.each(blocks):  # shared with any other user of this engine
                now = self.clock()
                self.metrics.block_committed(block, now - (job.arrived if first else previous), first)
                previous, first = now, first and not block.token_ids
                if block.stats is not None:
                    self.metrics.request_finished(
                        block.stats.finish_reason or "stop", block.stats.n_prompt_tokens, now - job.arrived
                    )
                job.deliver(block)
        except Exception as error:  # the request fails; the worker and the server go on
            log.exception("generation failed")
            self.metrics.request_finished("error", len(job.prompt_ids), self.clock() - job.arrived)
            self._conversation = self.engine.new_conversation()  # its cache state is unknown now
            job.deliver(JobFailed(f"the engine failed: {type(error).__name__}: {error}"))
