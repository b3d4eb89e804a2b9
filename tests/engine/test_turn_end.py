"""The end-of-turn score on the bundled pair (ggml): complete words score high, the reply is untouched."""

import pytest

from engine.generate import FEED_AHEAD_GROWTH, Engine
from engine.load import chat_prompt, load_engine
from engine.sampling import SamplingParams
from engine.turn_end import ScoreModel, turn_marks, user_words
from tests.support.bundled import DRAFT, TARGET, TINY, greedy_ids, question, reply_after_a_score

pytestmark = pytest.mark.bundled

# (incomplete, complete) pairs a voice agent hears, without final marks (as LocalLLM scores them); none of
# them tunes the policy's thresholds.
PAIRS = [
    ("What is the capital of", "What is the capital of France"),
    ("Could you remind me to", "Could you remind me to call my sister after lunch"),
    ("I want to buy apples and", "I want to buy apples and pears"),
]


@pytest.fixture(scope="module")
def pair() -> Engine:
    return load_engine(TARGET, DRAFT, backend="ggml", max_seq_len=512, gamma=4)


def words_of(engine: Engine, text: str, history: list[dict[str, str]] | None = None) -> list[int]:
    messages = [*(history or []), {"role": "user", "content": text}]
    return user_words(chat_prompt(engine.tokenizer, messages), turn_marks(engine.tokenizer).end_of_turn_id)


def test_the_words_are_the_reply_prompt_cut_before_the_closing_id(pair: Engine) -> None:
    prompt = chat_prompt(pair.tokenizer, [{"role": "user", "content": "Hello there"}])
    words = words_of(pair, "Hello there")
    assert prompt[: len(words)] == words
    assert prompt[len(words)] == turn_marks(pair.tokenizer).end_of_turn_id
    assert pair.tokenizer.decode(words).endswith("Hello there")


@pytest.mark.parametrize("model", ["draft", "target"])
def test_complete_questions_score_higher_than_incomplete_ones(pair: Engine, model: ScoreModel) -> None:
    """The model's own score, without a trained head (engine/turn_head.py)."""
    conversation = pair.new_conversation()
    for incomplete, complete in PAIRS:
        low = conversation.end_of_turn_probability(words_of(pair, incomplete), model=model, learned=False)
        high = conversation.end_of_turn_probability(words_of(pair, complete), model=model, learned=False)
        assert low is not None and high is not None
        assert low < 0.01 < 0.03 < high, (incomplete, low, complete, high)


def test_the_message_may_end_after_a_mark(pair: Engine) -> None:
    """With after_mark_power 1 what follows the mark counts: a request ends there, a statement less so."""
    conversation = pair.new_conversation()
    request = conversation.end_of_turn_probability(words_of(pair, "Tell me a joke."), after_mark_power=1)
    cut = conversation.end_of_turn_probability(words_of(pair, "Tell me a"), after_mark_power=1)
    assert request is not None and cut is not None
    assert cut < 0.01 < 0.5 < request


@pytest.mark.parametrize(("model", "learned"), [("draft", False), ("target", False), ("draft", True)])
def test_scoring_leaves_the_reply_unchanged_and_the_words_cached(
    pair: Engine, model: ScoreModel, learned: bool
) -> None:
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    question = "What's a good name for a black cat?"
    messages = [*history, {"role": "user", "content": question}]
    prompt = chat_prompt(pair.tokenizer, messages)
    params = SamplingParams(max_new_tokens=24)
    plain = [t for b in pair.new_conversation().generate(prompt, params) for t in b.token_ids]

    scored = pair.new_conversation()
    scored.generate(chat_prompt(pair.tokenizer, history[:1]), SamplingParams(max_new_tokens=4))
    partial = ""
    for word in question.split():  # a partial per word, as the user speaks
        partial = f"{partial} {word}".strip()
        score = scored.end_of_turn_probability(words_of(pair, partial, history), model=model, learned=learned)
        assert score is not None and 0.0 <= score <= 1.0
    words = words_of(pair, question, history)
    assert scored.tokens == words
    state = scored.target if model == "target" else scored.draft
    assert state is not None and state.valid == len(words)  # the words stay cached
    after = [t for b in scored.generate(prompt, params) for t in b.token_ids]
    assert after == plain


def test_a_score_carrying_the_reply_s_prompt_gives_the_same_score_and_reply(pair: Engine) -> None:
    """On llama.cpp's kernels too: the words' score is what it is without the reply's prompt, and the
    reply begun from the score's last row is the plain reply."""
    text = "Why do onions make people cry?"
    words = words_of(pair, text.rstrip("?"))
    alone = pair.new_conversation().end_of_turn_probability(words, model="target")
    carrying = pair.new_conversation().end_of_turn_probability(
        words, model="target", reply_prompt=chat_prompt(pair.tokenizer, [{"role": "user", "content": text}])
    )
    # llama.cpp's several-row kernels round otherwise than its one-row kernel (0.008 here)
    assert alone is not None and carrying == pytest.approx(alone, abs=0.02)
    ids, forwards, held = reply_after_a_score(pair, text, 0, 24)
    assert held and forwards == 0
    assert ids == greedy_ids(pair, question(pair, text), 0, 24)


def test_held_logits_are_dropped_when_the_user_speaks_on(pair: Engine) -> None:
    """The score held the first logits of a reply to "Tell me a joke"; the user went on, and the reply to
    the longer words is the plain one (its prompt's last id fed again, not the stale logits)."""
    conversation = pair.new_conversation()
    short = chat_prompt(pair.tokenizer, [{"role": "user", "content": "Tell me a joke"}])
    conversation.end_of_turn_probability(words_of(pair, "Tell me a joke"), model="target", reply_prompt=short)
    assert conversation.target.next_logits is not None
    longer = "Tell me a joke about cats"
    conversation.end_of_turn_probability(words_of(pair, longer), model="target")
    assert conversation.target.next_logits is None
    prompt = chat_prompt(pair.tokenizer, [{"role": "user", "content": longer}])
    after = [t for b in conversation.generate(prompt, SamplingParams(max_new_tokens=16)) for t in b.token_ids]
    assert after == greedy_ids(pair, prompt, 4, 16)


def test_auto_scores_on_the_target_where_it_is_fed_ahead(pair: Engine) -> None:
    """On a CPU the target's forwards grow with the ids, so prefill feeds it ahead, and "auto" scores on it:
    the same score as the target's, and its cache holds the words."""
    words = words_of(pair, "How far away is the moon")
    auto, target = pair.new_conversation(), pair.new_conversation()
    assert auto.feeds_target_ahead() == pair.speculation.forwards_grow_with_ids(FEED_AHEAD_GROWTH)
    score = auto.end_of_turn_probability(words, model="auto")
    expected = target.end_of_turn_probability(words, model="target" if auto.feeds_target_ahead() else "draft")
    assert score is not None and score == pytest.approx(expected, abs=1e-4)
    state = auto.target if auto.feeds_target_ahead() else auto.draft
    assert state is not None and state.valid == len(words)
    with pytest.raises(ValueError, match="end-of-turn model"):
        auto.end_of_turn_probability(words, model="both")  # type: ignore[arg-type]


def test_no_score_while_the_conversation_generates(pair: Engine) -> None:
    conversation = pair.new_conversation()
    prompt = chat_prompt(pair.tokenizer, [{"role": "user", "content": "Count to five."}])
    blocks = conversation.generate(prompt, SamplingParams(max_new_tokens=16))
    next(blocks)  # the generation holds the conversation until it ends
    assert conversation.end_of_turn_probability(words_of(pair, "Tell me")) is None
    blocks.close()
    assert conversation.end_of_turn_probability(words_of(pair, "Tell me")) is not None


def test_without_a_draft_the_target_scores() -> None:
    tiny = load_engine(TINY, None, backend="ggml", max_seq_len=256)
    conversation = tiny.new_conversation()
    score = conversation.end_of_turn_probability(words_of(tiny, "Thank you very much."))
    assert score is not None and 0.0 <= score <= 1.0
    assert conversation.target.valid == len(conversation.tokens)
