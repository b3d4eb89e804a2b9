"""`python -m engine serve` as a user runs it, called with the official `openai` client.

One server process (SmolLM2-135M as target and as draft, so every draft is accepted and blocks are
gamma + 1 = 5 tokens long) serves every test of this module.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import free_port, wait_until_healthy

pytestmark = pytest.mark.bundled

MODEL = "smollm2-135m-instruct"
GAMMA = 4
QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    # fp32: a cached prompt's first verification carries fewer ids, which in bf16 can flip a near-tie.
    command = [
        sys.executable, "-m", "engine", "serve", "--model", MODEL, "--speculative-model", MODEL,
        "--num-speculative-tokens", str(GAMMA), "--max-model-len", "1024", "--port", str(port),
        "--uvicorn-log-level", "warning", "--dtype", "fp32",
    ]  # fmt: skip
    with log.open("w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(20)


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60.0)


def scrape(base_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, keyed by (name, sorted labels without model_name/engine)."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=5.0).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in sample.labels.items() if k not in ("model_name", "engine"))
            )
            samples[(sample.name, labels)] = sample.value
    return samples


def test_health_and_models(base_url: str, client: openai.OpenAI) -> None:
    assert httpx.get(base_url.removesuffix("/v1") + "/health").status_code == 200
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL]


def test_chat_completion_streamed_equals_whole(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20)
    answer = whole.choices[0].message.content
    assert answer and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.completion_tokens <= 20
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=20, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == answer  # greedy: the same words, whether streamed or not
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )
    # The second request shared the first one's prompt: its keys were still in the cache.
    assert chunks[-1].usage.prompt_tokens_details is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


def test_one_chunk_per_committed_block(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=30,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    blocks = [chunk.model_extra["block"] for chunk in chunks]
    assert sum(b["n_tokens"] for b in blocks) == 30
    for block, following in zip(blocks, blocks[1:], strict=False):
        assert following["position"] == block["position"] + block["n_tokens"]  # no block split or merged
    for block in blocks[:-1]:  # each block: the accepted drafts + one corrected or bonus token
        assert block["n_drafted"] <= GAMMA and block["n_tokens"] == block["n_accepted"] + 1
    # The draft is the target itself, so nearly every draft is accepted (bf16 rounding can flip a near-tie).
    assert sum(b["n_accepted"] for b in blocks) >= 0.75 * sum(b["n_drafted"] for b in blocks)
    assert len(blocks) < 30 / 2


def test_completions_streamed_and_whole(client: openai.OpenAI) -> None:
    prompt = "def fibonacci(n):"
    whole = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=20)
    streamed = client.completions.create(
        model=MODEL, prompt=prompt, temperature=0, max_tokens=20, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in streamed)
    assert text == whole.choices[0].text and text
    assert whole.choices[0].finish_reason in ("stop", "length")


def test_seed_stop_and_temperature(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=1.0, top_p=0.9, seed=seed, max_tokens=12
        )
        return reply.choices[0].message.content or ""

    assert sample(7) == sample(7)
    greedy = client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=20)
    text = greedy.choices[0].message.content or ""
    stop = text.split()[2]
    stopped = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=20, stop=[stop]
    )
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_metrics_count_what_was_generated(base_url: str, client: openai.OpenAI) -> None:
    before = scrape(base_url)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        temperature=0,
        max_tokens=23,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    blocks = [chunk.model_extra["block"] for chunk in stream if chunk.choices]
    after = scrape(base_url)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    # The counters say exactly what the client saw block by block.
    assert delta("vllm:generation_tokens_total") == 23 == sum(b["n_tokens"] for b in blocks)
    assert delta("vllm:spec_decode_num_drafts_total") == len([b for b in blocks if b["n_drafted"]])
    assert delta("vllm:spec_decode_num_draft_tokens_total") == sum(b["n_drafted"] for b in blocks)
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == sum(b["n_accepted"] for b in blocks)
    per_position = [
        delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(4)
    ]
    assert per_position == [len([b for b in blocks if b["n_accepted"] > p]) for p in range(4)]
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:time_to_first_token_seconds_count") == 1
    assert delta("vllm:inter_token_latency_seconds_count") == len(blocks) - 1
    assert delta("vllm:e2e_request_latency_seconds_count") == 1
    assert delta("vllm:request_queue_time_seconds_count") == 1
    assert after[("vllm:num_requests_running", ())] == 0
    assert after[("vllm:num_requests_waiting", ())] == 0
