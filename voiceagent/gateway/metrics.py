"""Prometheus metrics of the gateway, in a registry of its own (several apps can live in one process).

Gauges: voiceagent_sessions_active{transport}.
Counters (exposed with `_total`): voiceagent_sessions{transport}, voiceagent_sessions_refused{transport,
reason}, voiceagent_turns{transport, outcome} (outcome: done | interrupted | error), and speculative
decoding as the agent spoke it: voiceagent_spec_blocks (committed blocks), voiceagent_spec_draft_tokens,
voiceagent_spec_accepted_tokens. The acceptance rate is accepted / draft tokens, as in vLLM's PromQL.
Histograms: voiceagent_voice_to_voice_seconds (the user stops speaking -> the agent's first audio leaves
the server) and voiceagent_stage_latency_seconds{stage} for each headline stage measured from the end
of speech (asr_final, first_block, tts_first_audio, voice_to_voice), from the session's trace; spoken turns
only (a typed turn has no end of speech).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Voice latencies live between ~100 ms and a few seconds on a CPU.
LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_active = Gauge(
            "voiceagent_sessions_active", "Live voice sessions.", ["transport"], registry=r
        )
        self.sessions = Counter("voiceagent_sessions", "Voice sessions started.", ["transport"], registry=r)
        self.sessions_refused = Counter(
            "voiceagent_sessions_refused", "Sessions refused.", ["transport", "reason"], registry=r
        )
        self.turns = Counter(
            "voiceagent_turns", "Agent turns by outcome.", ["transport", "outcome"], registry=r
        )
        self.spec_blocks = Counter("voiceagent_spec_blocks", "Committed LLM blocks spoken.", registry=r)
        self.spec_draft_tokens = Counter(
            "voiceagent_spec_draft_tokens", "Tokens the draft model proposed.", registry=r
        )
        self.spec_accepted_tokens = Counter(
            "voiceagent_spec_accepted_tokens", "Drafted tokens the target accepted.", registry=r
        )
        self.voice_to_voice = Histogram(
            "voiceagent_voice_to_voice_seconds",
            "End of the user's speech to the agent's first audio sent.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_latency = Histogram(
            "voiceagent_stage_latency_seconds",
            "End of the user's speech to each stage's first output.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def observe_block(self, n_drafted: int | None, n_accepted: int | None) -> None:
        self.spec_blocks.inc()
        if n_drafted is not None and n_accepted is not None:
            self.spec_draft_tokens.inc(n_drafted)
            self.spec_accepted_tokens.inc(n_accepted)

    def observe_turn(self, transport: str, outcome: str, latency_ms: dict[str, float | None]) -> None:
        self.turns.labels(transport, outcome).inc()
        for stage, ms in latency_ms.items():
            if ms is None or ms < 0:
                continue
            self.stage_latency.labels(stage).observe(ms / 1000)
            if stage == "voice_to_voice":
                self.voice_to_voice.observe(ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
