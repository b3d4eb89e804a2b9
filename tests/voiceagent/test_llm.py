"""The voice agent's LLM backends: the engine in-process, and `python -m engine serve` over HTTP.

Both run SmolLM2-135M (target and draft) in bf16, so greedy replies must be the same words either way.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.generate import Engine
from engine.load import load_engine
from tests.support.servers import free_port, wait_until_healthy
from voiceagent.config import Settings
from voiceagent.llm import LLM, LLMError, LocalLLM, RemoteLLM, ReplyBlock, ReplyOptions, connect_llm

pytestmark = pytest.mark.bundled

MODEL = "smollm2-135m-instruct"
KEY = "voice-key"
HISTORY = [
    {"role": "system", "content": "You are a helpful voice assistant. Answer briefly."},
    {"role": "user", "content": "What colour is the sky?"},
]
OPTIONS = ReplyOptions(max_tokens=24)
LONG = ReplyOptions(max_tokens=200)
SHORT = ReplyOptions(max_tokens=12)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """`python -m engine serve` in a subprocess, with an API key (it loads while this process loads)."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    command = [
        sys.executable, "-m", "engine", "serve", MODEL, "--speculative-model", MODEL,
        "--max-model-len", "512", "--port", str(port), "--api-key", KEY, "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    with log.open("w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        yield process, port, log
    finally:
        process.terminate()
        process.wait(20)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine(MODEL, MODEL, max_seq_len=512)


@pytest.fixture(scope="module")
def server_url(server: tuple[subprocess.Popen[bytes], int, Path], engine: Engine) -> str:
    process, port, log = server
    wait_until_healthy(f"http://127.0.0.1:{port}", process, log)
    return f"http://127.0.0.1:{port}/v1"


async def reply(llm: LLM, options: ReplyOptions = OPTIONS) -> list[ReplyBlock]:
    return [block async for block in llm.stream(HISTORY, options)]


def aborted_requests(server_url: str) -> float:
    text = httpx.get(server_url.removesuffix("/v1") + "/metrics").text
    line = next(line for line in text.splitlines() if line.startswith("vllm:request_success_total{")
                and 'finished_reason="abort"' in line)  # fmt: skip
    return float(line.rsplit(" ", 1)[1])


def test_remote_and_local_give_the_same_blocks(server_url: str, engine: Engine) -> None:
    async def both() -> tuple[list[ReplyBlock], list[ReplyBlock]]:
        remote = RemoteLLM(server_url, api_key=KEY)
        local = LocalLLM(engine)
        try:
            return await reply(remote), await reply(local)
        finally:
            await remote.aclose()
            await local.aclose()

    remote_blocks, local_blocks = asyncio.run(both())
    assert "".join(b.text for b in remote_blocks) == "".join(b.text for b in local_blocks) != ""
    # The engine server tells the client what each block drafted and accepted, block for block.
    assert [(b.n_tokens, b.n_drafted, b.n_accepted) for b in remote_blocks] == [
        (b.n_tokens, b.n_drafted, b.n_accepted) for b in local_blocks
    ]
    assert remote_blocks[-1].finish_reason == local_blocks[-1].finish_reason in ("stop", "length")
    assert all(b.n_tokens is not None and b.n_tokens >= 1 for b in remote_blocks)


def test_remote_turn_cancelled_by_leaving_the_stream(server_url: str) -> None:
    async def barge_in() -> list[ReplyBlock]:
        remote = RemoteLLM(server_url, api_key=KEY, model=MODEL)
        try:
            stream = remote.stream(HISTORY, LONG)
            first = await anext(stream)
            assert first.text
            await stream.aclose()  # the user spoke: the turn is dropped after its first block
            return await reply(remote)  # the next turn is served normally
        finally:
            await remote.aclose()

    aborted = aborted_requests(server_url)
    blocks = asyncio.run(barge_in())
    assert blocks[-1].finish_reason is not None
    assert aborted_requests(server_url) == aborted + 1


def test_remote_errors_are_llm_errors(server_url: str) -> None:
    async def ask(llm: RemoteLLM, messages: list[dict[str, str]] = HISTORY) -> None:
        try:
            async for _ in llm.stream(messages, OPTIONS):
                pass
        finally:
            await llm.aclose()

    with pytest.raises(LLMError, match="401: Incorrect or missing API key"):
        asyncio.run(ask(RemoteLLM(server_url, api_key="wrong", model=MODEL)))
    with pytest.raises(LLMError, match="404: The model `gpt-9` does not exist"):
        asyncio.run(ask(RemoteLLM(server_url, api_key=KEY, model="gpt-9")))
    too_long = [{"role": "user", "content": "word " * 600}]
    with pytest.raises(LLMError, match="400: This model's maximum context length is 512 tokens"):
        asyncio.run(ask(RemoteLLM(server_url, api_key=KEY), too_long))
    with pytest.raises(LLMError, match="cannot reach"):
        asyncio.run(ask(RemoteLLM(f"http://127.0.0.1:{free_port()}/v1", timeout_s=5.0)))


def test_local_barge_in_cancels_between_blocks(engine: Engine) -> None:
    async def barge_in() -> tuple[list[ReplyBlock], list[ReplyBlock]]:
        local = LocalLLM(engine)
        received: list[ReplyBlock] = []
        speaking = asyncio.Event()

        async def speak() -> None:
            async for block in local.stream(HISTORY, LONG):
                received.append(block)
                speaking.set()

        turn = asyncio.create_task(speak())
        await speaking.wait()
        turn.cancel()  # what the session does on speech_start while the agent speaks
        with pytest.raises(asyncio.CancelledError):
            await turn
        next_turn = await reply(local)
        await local.aclose()
        return received, next_turn

    generated = engine.metrics.num_generated_tokens
    received, next_turn = asyncio.run(barge_in())
    assert next_turn[-1].finish_reason in ("stop", "length")
    # The interrupted turn asked for 200 tokens; it stopped within a block or two of the barge-in.
    assert sum(b.n_tokens or 0 for b in received) < 20
    assert engine.metrics.num_generated_tokens - generated < 20 + OPTIONS.max_tokens


def test_local_generation_stops_at_the_next_block_after_aclose(engine: Engine) -> None:
    async def leave_early() -> None:
        local = LocalLLM(engine)
        stream = local.stream(HISTORY, LONG)
        await anext(stream)
        await stream.aclose()
        await local.aclose()  # waits for the worker thread: the engine has stopped

    asyncio.run(leave_early())
    last = engine.metrics.last
    assert last is not None and last.finish_reason == "cancelled" and last.n_generated < 30


def test_two_sessions_share_one_engine(engine: Engine) -> None:
    async def together() -> tuple[list[ReplyBlock], ...]:
        first, second = LocalLLM(engine), LocalLLM(engine)
        return tuple(await asyncio.gather(reply(first, SHORT), reply(second, SHORT)))

    alone = asyncio.run(reply(LocalLLM(engine), SHORT))
    both = asyncio.run(together())
    texts = {"".join(b.text for b in blocks) for blocks in (alone, *both)}
    assert len(texts) == 1  # interleaved block by block, each conversation is still exact


def test_local_blocks_say_where_their_time_went(engine: Engine) -> None:
    """Each block of the in-process engine carries its cost (the trace's llm.block): what it waited for
    since the last block was handed on, and its work, of which the draft's steps and the verify. A server's
    blocks carry none."""
    blocks = asyncio.run(reply(LocalLLM(engine), SHORT))
    assert blocks and all(b.timing is not None for b in blocks)
    for block in blocks:
        cost = block.timing
        assert cost is not None and min(cost.waited, cost.draft, cost.verify) >= 0.0
        assert cost.engine >= cost.draft + cost.verify - 0.05  # rounded to 0.01 ms each
    assert any(b.timing is not None and b.timing.verify > 0.0 for b in blocks)
    drafting = [b for b in blocks if b.n_drafted]
    assert all(b.timing is not None and b.timing.draft > 0.0 for b in drafting)
    assert all(b.timing is not None and b.timing.held == 0.0 for b in blocks)  # no lane: never held


def test_a_local_block_says_how_long_its_forwards_were_held_for_speech(engine: Engine) -> None:
    """Forwards held between layers while speech jobs run (voiceagent/cpu_lane.py) count in the block's
    work, and its cost says how much of it they were held."""
    hold_s = 0.001
    engine.pause_between_layers(lambda: time.sleep(hold_s))
    try:
        blocks = asyncio.run(reply(LocalLLM(engine), SHORT))
    finally:
        engine.pause_between_layers(None)
    assert blocks
    for block in blocks:
        cost = block.timing
        assert cost is not None and cost.held >= 1000 * hold_s  # every block's verify was held at least once
        assert cost.engine >= cost.held


def test_local_bad_input_is_an_llm_error(engine: Engine) -> None:
    async def ask() -> None:
        async for _ in LocalLLM(engine).stream([{"role": "user", "content": "word " * 600}], OPTIONS):
            pass

    with pytest.raises(LLMError, match="KV cache holds 512"):
        asyncio.run(ask())


def test_configuration_chooses_the_backend(
    monkeypatch: pytest.MonkeyPatch, server_url: str, engine: Engine
) -> None:
    monkeypatch.setenv("VOICEAGENT_LLM", server_url + "/")
    monkeypatch.setenv("VOICEAGENT_LLM_API_KEY", KEY)
    remote = connect_llm(Settings())
    assert isinstance(remote, RemoteLLM) and remote.base_url == server_url
    blocks = asyncio.run(reply(remote))
    assert blocks and blocks[-1].finish_reason is not None
    monkeypatch.setenv("VOICEAGENT_LLM", "local")
    local = connect_llm(Settings(), engine=engine)
    assert isinstance(local, LocalLLM) and local.engine is engine


def test_a_short_conversation_drops_the_oldest_turns_to_fit(engine: Engine) -> None:
    turns = [{"role": "system", "content": "You are a helpful voice assistant. Answer briefly."}]
    for i in range(12):  # ~25 ids a turn pair: far over 160
        turns += [
            {"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"},
            {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."},
        ]
    turns.append({"role": "user", "content": "What colour is the sky?"})
    short = LocalLLM(engine, conversation=engine.new_conversation(160))

    async def ask() -> list[ReplyBlock]:
        return [block async for block in short.stream(turns, SHORT)]

    blocks = asyncio.run(ask())  # no "prompt too long": the oldest turns made room
    assert "".join(b.text for b in blocks).strip()
    conversation = short._conversation
    assert conversation.max_seq_len == 160 and conversation.target.valid <= 160
    text = engine.tokenizer.decode(conversation.tokens)
    assert "helpful voice assistant" in text and "colour is the sky" in text and "number 0:" not in text
    assert conversation.target.cache.k.shape[-2] == 160  # [n_layers, 1, KVH, 160, D]: a small cache


def test_a_voice_session_of_the_default_pair_caches_under_50_mb() -> None:
    import torch

    from engine.config import NAMED_SHAPES
    from engine.model import KVCache

    context = Settings().session_context_tokens
    caches = [
        KVCache(NAMED_SHAPES[name], context, torch.bfloat16, torch.device("meta"))  # sizes, no memory
        for name in ("qwen2.5-1.5b", "qwen2.5-0.5b")
    ]
    assert sum(cache.nbytes for cache in caches) < 50e6  # the rest of a session is small Python state
