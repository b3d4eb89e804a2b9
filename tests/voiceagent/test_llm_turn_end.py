"""LocalLLM's end-of-turn score on the bundled pair (ggml): partial transcripts in, P(turn complete) out."""

from __future__ import annotations

import asyncio

import pytest

from engine.generate import Engine
from engine.load import load_engine
from tests.support.bundled import DRAFT, TARGET
from voiceagent.llm import LocalLLM, RemoteLLM, ReplyOptions, TurnScoringLLM

pytestmark = pytest.mark.bundled

SYSTEM = {"role": "system", "content": "You are a friendly voice assistant. Answer in one short sentence."}


@pytest.fixture(scope="module")
def pair() -> Engine:
    return load_engine(TARGET, DRAFT, backend="ggml", max_seq_len=512, gamma=4)


def said(text: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": text}]


def test_only_the_local_engine_scores_turns() -> None:
    assert issubclass(LocalLLM, TurnScoringLLM)
    assert not isinstance(RemoteLLM("http://127.0.0.1:9/v1"), TurnScoringLLM)


def test_a_finished_question_scores_above_a_cut_one_whatever_its_final_mark(pair: Engine) -> None:
    llm = LocalLLM(pair)

    async def score(texts: list[str]) -> list[float | None]:
        return [await llm.end_of_turn_probability(said(text)) for text in texts]

    cut, cut_with_a_stop, finished, unpunctuated, no_words = asyncio.run(score([
        "Could you remind me to", "Could you remind me to.",  # the second as Whisper may hear it
        "What is the capital of France?", "what is the capital of france", "...",
    ]))  # fmt: skip
    assert None not in (cut, cut_with_a_stop, finished, unpunctuated)
    assert max(cut or 0, cut_with_a_stop or 0) < 0.01 < 0.03 < min(finished or 0, unpunctuated or 0)
    assert no_words is None


def test_no_score_while_a_reply_runs(pair: Engine) -> None:
    llm = LocalLLM(pair)

    async def score_during_and_after_a_reply() -> tuple[float | None, float | None]:
        reply = llm.stream(said("Count from one to twenty."), ReplyOptions(max_tokens=40))
        first = await reply.__anext__()
        assert first.finish_reason is None
        during = await llm.end_of_turn_probability(said("Tell me"))
        async for _ in reply:
            pass
        await llm.aclose()  # waits until the engine's thread has let go of the reply
        return during, await llm.end_of_turn_probability(said("Tell me"))

    during, after = asyncio.run(score_during_and_after_a_reply())
    assert during is None and after is not None
