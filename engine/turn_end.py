"""End of turn from a model's warm cache: the probability that the user's message is complete as heard so far.

A chat template closes every message with an end-of-turn id (ChatML's `<|im_end|>`). Fed the prompt up to
and including the user's words so far, a model's next-token distribution says how likely the message ends
right there. Streaming speech recognition often leaves out the final punctuation ("what is the capital of
france"), or puts a full stop after words cut off mid-sentence, so the ways to end through one punctuation
mark count too:

    P(complete | words) = P(eot | words) + sum over marks m in ? . ! of P(m | words) * P(eot | words m) ** a

P(m | words) sums every single id that is the mark alone or followed by newlines ("?", "?\n", "?\n\n"):
the chat-tuned models here put a question's "?" mostly in "?\n\n". `after_mark_power` a weighs what
follows the mark: 1 is the probability of the message ending after it (a mark whose P(m | words) is below
`MIN_MARK_PROBABILITY` is then skipped: it could add no more than that); 0, the default, counts a finished
sentence as a finished turn and needs no forward past the words. The bundled coder models expect a request
after a statement (P(eot | "I want to buy apples and pears.") is 0.02, after "Tell me a joke." 0.99), so on
20 hand-written texts, scored without their final marks, a = 0 left the widest gap between the lowest
complete (0.04) and the highest incomplete (< 0.001) text. Give the words without a final mark: a
recogniser puts a full stop after words cut off mid-sentence, and the score then measures only what follows.
Cost: one forward of the ids not cached yet (the words since the last call, in one forward up to
PREFILL_CHUNK of them), plus, when a > 0, one
single-id forward per mark worth asking about (usually one).

Which model scores (`Conversation.end_of_turn_probability`'s `model`, default the draft): on written
utterances and their prefixes at a speaker's pause (`python -m bench.turn_taking.text_scores`, the bundled
pair) the target separates better: AUC 0.979-0.988 against 0.953-0.977, and ~73% of finished ones at the
policy's 0.4 against ~45% ("How far away is the moon" 0.25 against the draft's 0.06). On speech, in real
time on a CPU, its higher scores ended finished questions ~70-100 ms sooner but cut off three times as many
pauses and lists (6 against 2 of 54 pauses): the recogniser's misreadings read finished ("Back a
toothbrush." for "Pack a toothbrush, ..."), and the target believes them more
(bench/results/2026-12-02-cpu-avx512-turn-score-model.md). "auto" is the target where it is fed the
user's words ahead anyway (`prefill` on a compute-bound CPU), so a score's forward is the reply's
prefill, and the draft elsewhere.

The cache is left as a reply wants it: the user's words are a prefix of the reply's prompt, so they stay
cached (a head start); the punctuation ids are rolled back (`valid` cut back to the words; the torch cache
overwrites those positions on the next feed, the ggml cache drops every cell from the next feed's first
position). `Conversation.tokens` becomes the words, as after `Conversation.prefill`.

Given the prompt of the reply that will be asked for next (`reply`: the words, their marks, the end of
turn and the assistant's header), a score on eager forwards (a CPU) feeds it in the same forward: causal
attention leaves the words' row as it was, and the last row's logits are held for the reply
(`ModelState.next_logits`): the draft's give the reply's first drafted token, the target's its first
token, without a forward of their own. On 2 CPU cores (the AMX Xeon, 2026-12-08, after 60 cached ids) the
0.5B draft's forward of 2 ids then one of 7 cost 41.2 ms, one of 9 ids 26.9; the target's 139.5 and
95.1. The tokens are then the reply's prompt; should another score or prefill come instead, the held
logits are dropped and the shared prefix stays cached as before.

A trained head (engine/turn_head.py; `head`) may give the score instead, from the same distribution.

Shapes: V = vocabulary.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

from engine.state import FUSED_PREFILL, PREFILL_CHUNK, ModelState, prefill_state
from engine.turn_head import TurnHead, raw_score

if TYPE_CHECKING:
    from engine.generate import Conversation

__all__ = ["SCORE_MODELS", "ScoreModel", "TurnMarks", "end_of_turn_probability", "turn_marks", "user_words"]

PUNCTUATION = ("?", ".", "!")  # marks that may end a spoken message the recogniser left unpunctuated
MARK_ENDINGS = ("", "\n", "\n\n", "\n\n\n")  # a mark's single ids: alone or with the newlines after it
MIN_MARK_PROBABILITY = 0.02  # below this a mark's share of the score is not worth a forward
AFTER_MARK_POWER = 0.0  # the exponent a in the module docstring: 0 separated best (bench/turn_taking)
ScoreModel = Literal["auto", "draft", "target"]  # whose cache scores (Conversation.end_of_turn_probability)
SCORE_MODELS: tuple[str, ...] = get_args(ScoreModel)


@dataclass(frozen=True)
class TurnMarks:
    """The ids that matter for the end of a user's message under one tokenizer's chat template."""

    end_of_turn_id: int  # the id that closes a message (ChatML: <|im_end|>)
    mark_ids: tuple[tuple[int, ...], ...]  # per mark of PUNCTUATION: its single ids, the bare mark first


_MARKS: weakref.WeakKeyDictionary[Any, TurnMarks] = weakref.WeakKeyDictionary()


def turn_marks(tokenizer: Any) -> TurnMarks:
    """The end-of-turn and punctuation ids of `tokenizer` (a transformers tokenizer with a chat template).

    The end-of-turn id is the last special id of a one-message chat without a generation prompt.
    """
    marks = _MARKS.get(tokenizer)
    if marks is not None:
        return marks
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("this model's tokenizer has no chat template, so no end-of-turn id to score")
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=False, tokenize=True
    )
    ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    special = set(tokenizer.all_special_ids)
    closing = [t for t in ids if t in special]
    if not closing:
        raise ValueError("the chat template closes a message with no special id: no end of turn to score")
    groups = []
    for mark in PUNCTUATION:
        encoded_endings = [tokenizer.encode(mark + end, add_special_tokens=False) for end in MARK_ENDINGS]
        if len(encoded_endings[0]) == 1:  # the bare mark is one id: fed to ask what follows the mark
            groups.append(tuple(int(e[0]) for e in encoded_endings if len(e) == 1))
    marks = TurnMarks(int(closing[-1]), tuple(groups))
    _MARKS[tokenizer] = marks
    return marks


def user_words(chat_prompt_ids: Sequence[int], end_of_turn_id: int) -> list[int]:
    """The chat prompt of a history ending with the user's (partial) message, cut just before the
    end-of-turn id that closes that message: the ids `end_of_turn_probability` scores."""
    ids = list(chat_prompt_ids)
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == end_of_turn_id:
            return ids[:i]
    raise ValueError(f"the prompt holds no end-of-turn id {end_of_turn_id}: give the chat prompt of messages")


@torch.inference_mode()
def end_of_turn_probability(
    conv: Conversation,
    words: list[int],
    marks: TurnMarks,
    after_mark_power: float = AFTER_MARK_POWER,
    *,
    on_target: bool = False,
    head: TurnHead | None = None,
    reply: list[int] | None = None,
) -> float:
    """P(the user's message is complete) after `words` (see the module docstring), on the draft model's
    cache (`on_target`, or no draft: the target's). `head`: that model's trained end-of-turn head
    (engine/turn_head.py), which then gives the score (after_mark_power is not used). `reply`: the
    prompt of the reply asked for next, fed in the same forward where it can be (`_reply_tail`). The
    caller holds the conversation's lock."""
    if after_mark_power < 0:
        raise ValueError(f"after_mark_power must be >= 0, got {after_mark_power}")
    state = conv.target if on_target or conv.draft is None else conv.draft
    conv.reuse_prefix(words)  # words become the committed ids; at least the last one is fed again
    if len(words) - state.valid > PREFILL_CHUNK:  # a long new prompt: in chunks, but for the last one
        prefill_state(state, conv.tokens, leave=PREFILL_CHUNK)
    n_words = len(words)
    tail = _reply_tail(conv, state, words, reply) if after_mark_power == 0 or head is not None else []
    # [1, V] after the words; with a reply's tail [1 + len(tail), V], its last row after the whole reply
    rows = state.feed([*words[state.valid :], *tail], state.valid, len(tail) + 1 if tail else "last")
    assert rows is not None
    state.valid = n_words
    if tail:
        assert reply is not None
        conv.hold_next_logits(state, reply, rows[-1:])
    logits = rows[:1]
    log_probs = logits[0].float().log_softmax(dim=-1)  # [V]: what follows the words
    probs = log_probs.exp()
    if head is not None:  # a trained head reads the same distribution (engine/turn_head.py)
        return head.probability(log_probs, raw_score(probs, marks))
    if after_mark_power == 0 or n_words + 1 >= conv.max_seq_len:  # no forward past the words
        return raw_score(probs, marks)
    score = float(probs[marks.end_of_turn_id])
    for group in marks.mark_ids:
        mark_probability = float(probs[list(group)].sum())
        if mark_probability >= MIN_MARK_PROBABILITY:
            after = _after_mark(state, n_words, group[0], marks.end_of_turn_id)
            score += mark_probability * after**after_mark_power
    state.valid = n_words  # the marks are rolled back: the next feed at n_words overwrites them
    return min(1.0, score)


def _reply_tail(
    conv: Conversation, state: ModelState, words: list[int], reply: list[int] | None
) -> list[int]:
    """The ids of `reply` after `words` (their marks, the end of turn, the assistant's header) that the
    score's forward on `state` may carry: where its forwards are eager (static ones would need a shape
    per tail; on a GPU the first block's forwards cost about a step anyway) and `reply` continues the
    words within the cache. Empty: the score feeds the words alone."""
    if reply is None or state.static is not None:
        return []
    tail = reply[len(words) :]
    if reply[: len(words)] != words or not 0 < len(tail) <= FUSED_PREFILL or len(reply) >= conv.max_seq_len:
        return []
    return tail


def _after_mark(state: ModelState, position: int, mark_id: int, end_of_turn_id: int) -> float:
    """P(eot | words mark): the mark fed at `position` (just after the words), then forgotten."""
    logits = state.feed([mark_id], position, "last")
    assert logits is not None  # [1, V]
    return float(logits[0].float().softmax(dim=-1)[end_of_turn_id])
