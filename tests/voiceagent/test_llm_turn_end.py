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


@pytest.mark.parametrize("learned", [False, True])
def test_a_finished_question_scores_above_a_cut_one_whatever_its_final_mark(
    pair: Engine, learned: bool
) -> None:
    """The model's own score (learned False) and its trained head's (engine/turn_head.py)."""
    llm = LocalLLM(pair, turn_head=learned)

    async def score(texts: list[str]) -> list[float | None]:
        return [await llm.end_of_turn_probability(said(text)) for text in texts]

    cut, cut_with_a_stop, finished, unpunctuated, no_words = asyncio.run(score([
        "Could you remind me to", "Could you remind me to.",  # the second as Whisper may hear it
        "What is the capital of France?", "what is the capital of france", "...",
    ]))  # fmt: skip
    assert None not in (cut, cut_with_a_stop, finished, unpunctuated)
    if learned:  # its own scale: a cut one below the policy's incomplete side, a finished one above
        assert max(cut or 0, cut_with_a_stop or 0) < 0.1 < 0.5 < min(finished or 0, unpunctuated or 0)
    else:
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


def test_words_fed_while_the_user_speaks_stop_before_the_template_tail(pair: Engine) -> None:
    """The head start caches the user's words only: the tail that closes their message and opens the
    reply would be thrown away as soon as they say one more word (4-5 ids a partial, each ~25-50 ms)."""
    from engine import chat_prompt
    from engine.turn_end import turn_marks

    llm, plain = LocalLLM(pair), LocalLLM(pair)
    so_far, question = said("Could you remind me to call"), said("Could you remind me to call my sister?")
    reply = ReplyOptions(max_tokens=8)

    async def head_start_then_reply() -> tuple[bool, list[int], str, str]:
        fed = await llm.prefill(so_far)
        cached = list(llm._conversation.tokens)
        text = "".join([block.text async for block in llm.stream(question, reply)])
        return fed, cached, text, "".join([block.text async for block in plain.stream(question, reply)])

    fed, cached, text, without = asyncio.run(head_start_then_reply())
    prompt = chat_prompt(pair.tokenizer, so_far)
    end_of_turn = turn_marks(pair.tokenizer).end_of_turn_id
    assert fed and cached == prompt[: len(prompt) - 1 - prompt[::-1].index(end_of_turn)]
    assert pair.tokenizer.decode(cached[-2:]).strip().endswith("call")  # the words, and no reply header
    assert text == without  # the head start changes nothing of the reply
