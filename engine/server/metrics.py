"""Prometheus metrics of the engine server, named as vLLM names them so its dashboards read them as they are.

Counters: vllm:prompt_tokens, vllm:generation_tokens, vllm:request_success{finished_reason},
vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens, vllm:spec_decode_num_accepted_tokens,
vllm:spec_decode_num_accepted_tokens_per_pos{position} (each exposed with the `_total` suffix).
Histograms: vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds (one observation per
committed block after the first: the time between blocks, as vLLM observes one per engine step),
vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds.
Gauges: vllm:num_requests_running, vllm:num_requests_waiting.
Every series carries vLLM's `model_name` and `engine` labels. Acceptance rate and mean acceptance length
follow from the counters exactly as in vLLM's PromQL (accepted / draft tokens; 1 + accepted / drafts).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.generate import CommittedBlock

CONTENT_TYPE = CONTENT_TYPE_LATEST

# vLLM's buckets for these histograms (vllm/v1/metrics/loggers.py).
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
# fmt: on

# The engine's finish reasons as vLLM's `finished_reason` label values.
FINISHED_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}


class ServerMetrics:
    """The server's metrics in a registry of its own (so several servers can live in one process)."""

    def __init__(self, model_name: str, num_speculative_tokens: int | None) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self._labels = {"model_name": model_name, "engine": "0"}

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*labels, *extra], registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.request_success = counter(
            "vllm:request_success", "Count of finished requests by finish reason.", ("finished_reason",)
        )
        self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.accepted_per_pos = counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ("position",),
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", REQUEST_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Time spent waiting in the queue in seconds.", REQUEST_BUCKETS
        )
        self.running = Gauge(
            "vllm:num_requests_running", "Requests being generated.", labels, registry=self.registry
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting in the queue.", labels, registry=self.registry
        )
        # Series that exist from the start read 0 rather than being absent (as in vLLM).
        for counter_ in (
            self.prompt_tokens,
            self.generation_tokens,
            self.drafts,
            self.draft_tokens,
            self.accepted_tokens,
        ):
            counter_.labels(**self._labels)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(**self._labels, finished_reason=reason)
        for position in range(num_speculative_tokens or 0):
            self.accepted_per_pos.labels(**self._labels, position=str(position))

    def watch_queue(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        """Reads the two gauges from the scheduler at scrape time."""
        self.running.labels(**self._labels).set_function(running)
        self.waiting.labels(**self._labels).set_function(waiting)

    def request_started(self, queue_s: float) -> None:
        self.queue_time.labels(**self._labels).observe(queue_s)

    def block_committed(self, block: CommittedBlock, since_previous_s: float, first: bool) -> None:
        """A committed block: speculative counters, generated tokens, TTFT (first) or inter-token latency."""
        labels = self._labels
        self.generation_tokens.labels(**labels).inc(len(block.token_ids))
        if block.n_drafted:
            self.drafts.labels(**labels).inc()
            self.draft_tokens.labels(**labels).inc(block.n_drafted)
            self.accepted_tokens.labels(**labels).inc(block.n_accepted)
            for position in range(block.n_accepted):
                self.accepted_per_pos.labels(**labels, position=str(position)).inc()
        if not block.token_ids:
            return  # a cancelled generation's closing block commits nothing: no latency to observe
        (self.ttft if first else self.itl).labels(**labels).observe(since_previous_s)

    def request_finished(self, finish_reason: str, n_prompt_tokens: int, e2e_s: float) -> None:
        self.prompt_tokens.labels(**self._labels).inc(n_prompt_tokens)
        reason = FINISHED_REASONS.get(finish_reason, finish_reason)
        self.request_success.labels(**self._labels, finished_reason=reason).inc()
        self.e2e.labels(**self._labels).observe(e2e_s)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
