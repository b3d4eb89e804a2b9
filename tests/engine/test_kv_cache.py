"""The static KV cache: rollback after rejections, prefix re-use across calls, cutting back."""

import threading

import pytest
import torch

from engine.generate import ModelState
from engine.sampling import SamplingParams
from tests.fakes import tiny_engine


def fresh_next_logits(state: ModelState, tokens: list[int]) -> torch.Tensor:
    model = state.model
    logits = model(torch.tensor(tokens), torch.arange(len(tokens)), model.new_cache(), kv_len=len(tokens))
    assert logits is not None
    return logits[-1]


def cached_next_logits(state: ModelState, tokens: list[int]) -> torch.Tensor:
    """Feeds what the cache lacks; positions past `valid` hold stale rejected drafts and get overwritten."""
    logits = state.feed(tokens[state.valid :], state.valid, "last")
    assert logits is not None
    state.valid = len(tokens)
    return logits[0]


def test_after_a_rejection_the_next_logits_equal_a_fresh_prefill() -> None:
    engine = tiny_engine("qwen2-bias", seed=3, init_std=0.1, draft_noise=0.15, gamma=5)
    conversation = engine.new_conversation()
    checked = 0
    for block in conversation.generate([9, 8, 7, 6], SamplingParams(max_new_tokens=60)):
        if block.finish_reason is None and block.n_accepted < block.n_drafted:
            tokens = list(conversation.tokens)
            for state in conversation.states:
                valid = state.valid
                torch.testing.assert_close(
                    cached_next_logits(state, tokens), fresh_next_logits(state, tokens), rtol=1e-5, atol=1e-5
                )
                state.valid = valid  # leave the conversation as the generator expects it
            checked += 1
    assert checked >= 3


def test_a_follow_up_prompt_reuses_the_cached_conversation() -> None:
    engine = tiny_engine("qwen2-bias", seed=3, init_std=0.1, draft_noise=0.15)
    reference = tiny_engine("qwen2-bias", draft=None, seed=3, init_std=0.1)
    conversation = engine.new_conversation()
    first = list(conversation.generate([9, 8, 7, 6], SamplingParams(max_new_tokens=20)))
    history = list(conversation.tokens)
    follow_up = [*history, 50, 51, 52]
    blocks = list(conversation.generate(follow_up, SamplingParams(max_new_tokens=20)))
    stats = blocks[-1].stats
    assert stats is not None and first[-1].stats is not None
    assert stats.n_cached_prompt_tokens >= len(history) - 1  # only the new ids were prefilled
    expected = list(reference.new_conversation().generate(follow_up, SamplingParams(max_new_tokens=20)))
    assert [t for b in blocks for t in b.token_ids] == [t for b in expected for t in b.token_ids]


def test_cutting_back_to_a_committed_position() -> None:
    """After a barge-in the history keeps only what was heard; the next turn continues from there."""
    engine = tiny_engine("qwen2-bias", seed=5, init_std=0.1, draft_noise=0.15)
    reference = tiny_engine("qwen2-bias", draft=None, seed=5, init_std=0.1)
    conversation = engine.new_conversation()
    list(conversation.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=30)))
    conversation.truncate(12)  # the user heard 8 of the 30 generated tokens
    assert len(conversation.tokens) == 12
    assert all(state.valid <= 12 for state in conversation.states)
    prompt = [*conversation.tokens, 70, 71]
    got = [t for b in conversation.generate(prompt, SamplingParams(max_new_tokens=15)) for t in b.token_ids]
    fresh = reference.new_conversation().generate(prompt, SamplingParams(max_new_tokens=15))
    assert got == [t for b in fresh for t in b.token_ids]


def test_a_different_prompt_overwrites_the_cache() -> None:
    engine = tiny_engine("qwen2-bias", seed=5, init_std=0.1, draft_noise=0.15)
    reference = tiny_engine("qwen2-bias", draft=None, seed=5, init_std=0.1)
    conversation = engine.new_conversation()
    list(conversation.generate(list(range(1, 30)), SamplingParams(max_new_tokens=30)))
    prompt = [80, 81, 82]
    got = [t for b in conversation.generate(prompt, SamplingParams(max_new_tokens=15)) for t in b.token_ids]
    fresh = reference.new_conversation().generate(prompt, SamplingParams(max_new_tokens=15))
    assert got == [t for b in fresh for t in b.token_ids]


def test_conversations_on_one_engine_are_independent() -> None:
    engine = tiny_engine("qwen2-bias", seed=5, init_std=0.1, draft_noise=0.15)
    a, b = engine.new_conversation(), engine.new_conversation()
    params = SamplingParams(max_new_tokens=10)
    only_a = [t for blk in engine.new_conversation().generate([5, 6], params) for t in blk.token_ids]
    list(b.generate([40, 41, 42, 43], params))
    assert [t for blk in a.generate([5, 6], params) for t in blk.token_ids] == only_a


def _ids(conversation_blocks: object) -> list[int]:
    return [t for block in conversation_blocks for t in block.token_ids]  # type: ignore[attr-defined]


def test_a_forked_conversation_starts_from_the_cached_prefix_and_answers_the_same() -> None:
    engine = tiny_engine("qwen2-bias", seed=4, init_std=0.1, draft_noise=0.1, gamma=3)
    system = list(range(10, 50))  # a shared "system prompt"
    template = engine.new_conversation()
    _ids(template.generate([*system, 60], SamplingParams(max_new_tokens=1)))
    prompt = [*system, 61, 62, 63]
    expected = _ids(engine.new_conversation().generate(prompt, SamplingParams(max_new_tokens=24)))
    fork = template.fork()
    assert fork.target.valid >= len(system) and fork.tokens[: len(system)] == system
    blocks = list(fork.generate(prompt, SamplingParams(max_new_tokens=24)))
    assert _ids(blocks) == expected
    stats = blocks[-1].stats
    assert stats is not None and stats.n_cached_prompt_tokens >= len(system)  # not prefilled again
    assert template.tokens[: len(system) + 1] == [*system, 60]  # the template is untouched


def test_a_prefilled_partial_prompt_gives_the_same_answer_to_the_whole_one() -> None:
    engine = tiny_engine("llama3-rope-scaling", seed=5, init_std=0.1, draft_noise=0.1, gamma=4)
    prompt = list(range(3, 40))
    expected = _ids(engine.new_conversation().generate(prompt, SamplingParams(max_new_tokens=20)))
    conversation = engine.new_conversation()
    assert conversation.prefill([*prompt[:30], 90, 91]) == 0  # the user's words so far, then a guess
    assert conversation.target.valid == 31
    blocks = list(conversation.generate(prompt, SamplingParams(max_new_tokens=20)))
    assert _ids(blocks) == expected
    stats = blocks[-1].stats
    assert stats is not None and stats.n_cached_prompt_tokens == 30


@pytest.mark.parametrize(("nine_ids_s", "target_fed"), [(0.085, True), (0.055, False)])
def test_the_target_is_fed_ahead_where_its_forwards_grow_with_the_ids(
    nine_ids_s: float, target_fed: bool
) -> None:
    """A 9-id forward 1.7x a step (2 AVX-512 cores): the user's words go to the target too while they
    speak, so the reply's first verify carries fewer ids. 1.1x (a GPU): to the draft only."""
    engine = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.1, gamma="auto")
    engine.speculation.calibrate({1: 0.050, 2: 0.052, 9: nine_ids_s}, draft_step_s=0.010)
    conversation = engine.new_conversation()
    conversation.prefill(list(range(3, 20)), draft_only=True)
    assert conversation.draft is not None and conversation.draft.valid == 16
    assert conversation.target.valid == (16 if target_fed else 0)


def test_a_short_prompt_and_the_first_block_take_one_target_forward() -> None:
    engine = tiny_engine("qwen2-bias", seed=6, init_std=0.1, draft_noise=0.1, gamma=3)
    conversation = engine.new_conversation()
    feeds: list[int] = []
    feed = conversation.target.feed

    def counted(tokens: object, start: int, logits: object) -> object:
        feeds.append(len(tokens))  # type: ignore[arg-type]
        return feed(tokens, start, logits)  # type: ignore[arg-type]

    conversation.target.feed = counted  # type: ignore[method-assign]
    blocks = list(conversation.generate(list(range(5, 25)), SamplingParams(max_new_tokens=1)))
    assert len(feeds) == 1 and feeds[0] >= 20  # the prompt and the drafts, verified in one pass
    assert len(_ids(blocks)) == 1


def test_a_cancel_while_drafting_skips_the_verification() -> None:
    engine = tiny_engine("qwen2-bias", seed=7, init_std=0.1, draft_noise=0.1, gamma=4)
    conversation = engine.new_conversation()
    assert conversation.draft is not None
    cancel = threading.Event()
    target_feeds: list[int] = []
    draft_feed, target_feed = conversation.draft.feed, conversation.target.feed

    def drafting(tokens: object, start: int, logits: object) -> object:
        cancel.set()  # e.g. the user spoke on: the reply started at their pause is dropped
        return draft_feed(tokens, start, logits)  # type: ignore[arg-type]

    def verifying(tokens: object, start: int, logits: object) -> object:
        target_feeds.append(start)
        return target_feed(tokens, start, logits)  # type: ignore[arg-type]

    conversation.draft.feed = drafting  # type: ignore[method-assign]
    conversation.target.feed = verifying  # type: ignore[method-assign]
    blocks = list(conversation.generate(list(range(5, 25)), SamplingParams(max_new_tokens=20), cancel=cancel))
    assert [b.finish_reason for b in blocks] == ["cancelled"] and not blocks[0].token_ids
    assert target_feeds == []  # one draft step, and no target pass
    assert conversation.tokens == list(range(5, 25))


def test_a_conversation_can_hold_a_shorter_cache_than_the_engine() -> None:
    engine = tiny_engine("qwen2-bias", seed=8, init_std=0.1, draft_noise=0.1, gamma=3, max_seq_len=256)
    short = engine.new_conversation(48)
    assert short.target.cache.k.shape[-2] == 48 and short.draft is not None
    assert short.target.cache.nbytes * 256 == engine.new_conversation().target.cache.nbytes * 48
    blocks = list(short.generate(list(range(5, 25)), SamplingParams(max_new_tokens=100)))
    assert blocks[-1].finish_reason == "length"  # stopped at its own cache, not the engine's
    assert short.target.valid <= 48 and len(short.tokens) <= 49  # the last id never needs caching
    with pytest.raises(ValueError, match="KV cache holds 48"):
        list(short.generate(list(range(5, 60))))
    assert short.fork().max_seq_len == 48
    with pytest.raises(ValueError, match="2..256 positions"):
        engine.new_conversation(1000)
