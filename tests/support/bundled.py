"""What the tests of the bundled models share: their names, the questions, greedy ids, plain-path logits."""

from __future__ import annotations

from typing import Any

import torch

from engine.generate import FUSED_PREFILL, Engine, ModelState, prefill_state
from engine.load import chat_prompt
from engine.sampling import SamplingParams
from engine.turn_end import ScoreModel, turn_marks, user_words

TARGET, DRAFT, TINY = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
# Questions a voice agent hears, and one coding task; none of them was used to tune anything.
QUESTIONS = [
    "How do I reverse a string in JavaScript?",
    "What's a good name for a black cat?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Why do onions make people cry?",
    "Summarise what a hash map is in one sentence.",
    "List the planets of the solar system in order.",
]


def greedy_ids(engine: Engine, prompt: list[int], gamma: int | str, n: int) -> list[int]:
    blocks = engine.new_conversation().generate(prompt, SamplingParams(max_new_tokens=n), gamma=gamma)
    return [t for block in blocks for t in block.token_ids]


def question(engine: Engine, text: str) -> list[int]:
    """`text` as the user's message under the model's chat template."""
    return chat_prompt(engine.tokenizer, [{"role": "user", "content": text}])


def plain_path_logits(engine: Engine, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """The target's logits after prompt + generated, fed in the very forwards plain decoding runs: [V].

    A forward's rounding may depend on how many ids it holds (bf16 matrix kernels on AVX2 block and
    accumulate by row count; llama.cpp's several-row Q4_K kernels differ from its one-row kernel), so the
    keys of a prompt prefilled in one forward can differ from those of the same prompt split as plain
    decoding splits it. The schedule is the engine's own: the prompt but its last FUSED_PREFILL ids in
    PREFILL_CHUNK chunks, those ids with the first step, then one id a step.
    """
    state = ModelState(engine.target, engine.target.new_cache())
    prefill_state(state, prompt, leave=FUSED_PREFILL)
    logits = state.feed(prompt[state.valid :], state.valid, "last")
    for position, token in enumerate(generated, start=len(prompt)):
        logits = state.feed([token], position, "last")
    assert logits is not None
    return logits[0]


def reply_after_a_score(
    engine: Engine, text: str, gamma: int | str, n: int, model: ScoreModel = "target"
) -> tuple[list[int], int, bool]:
    """The greedy reply to the user's `text` on a conversation whose last forward was `model`'s score of the
    words (`text` without its final mark) carrying the reply's prompt (`reply_prompt`): (its ids, that
    model's forwards before the reply's first block, whether the score held the reply's first logits)."""
    prompt = question(engine, text)
    words = user_words(question(engine, text.rstrip("?.!")), turn_marks(engine.tokenizer).end_of_turn_id)
    conversation = engine.new_conversation()
    score = conversation.end_of_turn_probability(words, model=model, reply_prompt=prompt)
    assert score is not None and 0.0 <= score <= 1.0
    state = conversation.target if model == "target" else conversation.draft
    assert state is not None
    held = state.next_logits is not None and state.valid == len(prompt) and conversation.tokens == prompt
    forwards = 0
    feed = state.feed

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal forwards
        forwards += 1
        return feed(*args, **kwargs)

    state.feed = counted  # type: ignore[method-assign]
    blocks = conversation.generate(prompt, SamplingParams(max_new_tokens=n), gamma=gamma)
    ids = list(next(blocks).token_ids)
    before_first = forwards
    ids += [t for block in blocks for t in block.token_ids]
    assert state.next_logits is None  # taken once, or dropped by a later forward
    return ids, before_first, held
