"""Greedy speculative decoding commits exactly the target's own greedy tokens (fp32, tiny random pairs)."""

import threading

import pytest

from engine.generate import CommittedBlock, Conversation, Engine
from engine.generation import MERGED_FIRST_TAIL
from engine.sampling import SamplingParams
from tests.fakes import tiny_engine


def run(
    engine: Engine, prompt: list[int], params: SamplingParams, gamma: int | None = None
) -> list[CommittedBlock]:
    return list(engine.new_conversation().generate(prompt, params, gamma=gamma))


def ids_of(blocks: list[CommittedBlock]) -> list[int]:
    return [t for b in blocks for t in b.token_ids]


PROMPTS = [[7], [5, 17, 33, 2, 9], [int(x) for x in range(1, 40, 3)], [11, 11, 11, 11, 12, 90, 45, 3]]


@pytest.mark.parametrize("kind", ["llama2", "qwen2-bias", "mistral-sliding-window", "llama3-rope-scaling"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_speculative_equals_greedy_target(kind: str, seed: int) -> None:
    target_only = tiny_engine(kind, draft=None, seed=seed, init_std=0.1)
    speculative = tiny_engine(kind, draft="perturbed", seed=seed, init_std=0.1, draft_noise=0.15)
    params = SamplingParams(max_new_tokens=40)
    accepted = rejected = 0
    for prompt in PROMPTS:
        expected = ids_of(run(target_only, prompt, params))
        assert len(expected) == 40
        for gamma in (1, 2, 3, 5, 8):
            blocks = run(speculative, prompt, params, gamma)
            assert ids_of(blocks) == expected, (prompt, gamma)
            accepted += sum(b.n_accepted for b in blocks)
            rejected += sum(b.n_accepted < b.n_drafted for b in blocks)
    assert accepted > 0 and rejected > 0  # both paths of the verifier were exercised


def test_independent_draft_is_still_exact() -> None:
    """A draft that almost never agrees costs speed, never correctness."""
    target_only = tiny_engine("qwen2-bias", draft=None, seed=9, init_std=0.1)
    speculative = tiny_engine("qwen2-bias", draft="independent", seed=9, init_std=0.1)
    params = SamplingParams(max_new_tokens=30)
    for prompt in PROMPTS:
        assert ids_of(run(speculative, prompt, params, 4)) == ids_of(run(target_only, prompt, params))


def test_blocks_report_drafted_and_accepted() -> None:
    engine = tiny_engine("qwen2-bias", seed=1, init_std=0.1, draft_noise=0.15)
    blocks = run(engine, PROMPTS[1], SamplingParams(max_new_tokens=40), gamma=4)
    position = len(PROMPTS[1])
    for block in blocks:
        assert 0 <= block.n_accepted <= block.n_drafted <= 4
        assert block.position == position
        position += len(block.token_ids)
    stats = blocks[-1].stats
    assert stats is not None and blocks[-1].finish_reason == "length"
    assert stats.n_generated == 40 == sum(len(b.token_ids) for b in blocks)
    assert stats.n_accepted == sum(b.n_accepted for b in blocks)
    assert stats.n_draft_tokens == sum(b.n_drafted for b in blocks)
    assert sum(stats.accepted_per_position) == stats.n_accepted
    # Acceptance at a later position implies acceptance at every earlier one.
    assert stats.accepted_per_position == sorted(stats.accepted_per_position, reverse=True)
    assert stats.mean_accepted_len == pytest.approx(1 + stats.n_accepted / stats.n_drafts)
    assert engine.metrics.num_accepted_tokens == stats.n_accepted


def test_plain_decoding_is_one_token_per_block() -> None:
    engine = tiny_engine(draft=None)
    blocks = run(engine, [1, 2, 3], SamplingParams(max_new_tokens=12))
    assert [len(b.token_ids) for b in blocks] == [1] * 12
    assert all(b.n_drafted == 0 for b in blocks)


def test_eos_ends_generation_mid_block() -> None:
    engine = tiny_engine("qwen2-bias", seed=4, init_std=0.1, draft_noise=0.0, eos=True)
    reference = tiny_engine("qwen2-bias", draft=None, seed=4, init_std=0.1)
    free = ids_of(run(reference, [3, 4, 5], SamplingParams(max_new_tokens=60)))
    # Make the 6th generated token an EOS by declaring it so: output stops right after it.
    engine.eos_ids = frozenset({free[5]})
    first = free.index(free[5])
    blocks = run(engine, [3, 4, 5], SamplingParams(max_new_tokens=60), gamma=4)
    assert ids_of(blocks) == free[: first + 1]
    assert blocks[-1].finish_reason == "stop"
    ignored = run(engine, [3, 4, 5], SamplingParams(max_new_tokens=60, ignore_eos=True), gamma=4)
    assert ids_of(ignored) == free


def test_max_new_tokens_cuts_a_block() -> None:
    engine = tiny_engine("qwen2-bias", seed=4, init_std=0.1, draft_noise=0.0)
    for n in (1, 2, 5, 7):
        blocks = run(engine, [3, 4, 5], SamplingParams(max_new_tokens=n), gamma=4)
        assert len(ids_of(blocks)) == n and blocks[-1].finish_reason == "length"


def test_stop_string_ends_generation_and_is_not_emitted() -> None:
    engine = tiny_engine("qwen2-bias", seed=4, init_std=0.1, draft_noise=0.1)
    free = run(engine, [3, 4, 5], SamplingParams(max_new_tokens=30), gamma=3)
    text = "".join(b.text for b in free)
    stop = f" w{ids_of(free)[8]} "  # FakeTokenizer: id i is ' w{i}'; the trailing space avoids w1 ~ w12
    cut = text.index(stop)
    blocks = run(engine, [3, 4, 5], SamplingParams(max_new_tokens=30, stop=(stop,)), gamma=3)
    assert "".join(b.text for b in blocks) == text[:cut]
    assert blocks[-1].finish_reason == "stop"


def test_cache_end_finishes_with_length() -> None:
    engine = tiny_engine("qwen2-bias", seed=4, init_std=0.1, max_seq_len=24)
    blocks = run(engine, list(range(1, 15)), SamplingParams(max_new_tokens=100), gamma=4)
    assert blocks[-1].finish_reason == "length"
    assert 14 + len(ids_of(blocks)) <= 25


def test_cancellation_between_blocks() -> None:
    engine = tiny_engine("qwen2-bias", seed=4, init_std=0.1)
    cancel = threading.Event()
    seen = []
    for block in engine.new_conversation().generate(
        [1, 2], SamplingParams(max_new_tokens=200), cancel=cancel
    ):
        seen.append(block)
        if len(seen) == 3:
            cancel.set()
    assert len(seen) == 4 and seen[-1].finish_reason == "cancelled" and seen[-1].token_ids == ()
    assert seen[-1].stats is not None and seen[-1].stats.n_generated == len(ids_of(seen))


def test_closing_the_stream_leaves_a_usable_conversation() -> None:
    engine = tiny_engine("qwen2-bias", seed=4, init_std=0.1, draft_noise=0.1)
    reference = tiny_engine("qwen2-bias", draft=None, seed=4, init_std=0.1)
    conv = engine.new_conversation()
    stream = conv.generate([1, 2, 3], SamplingParams(max_new_tokens=50))
    next(stream)
    next(stream)
    stream.close()  # a consumer that stops listening (barge-in)
    prompt = [1, 2, 3, 40, 41]
    again = ids_of(list(conv.generate(prompt, SamplingParams(max_new_tokens=20))))
    assert again == ids_of(run(reference, prompt, SamplingParams(max_new_tokens=20)))


def draft_forwards(conversation: Conversation) -> list[int]:
    """A list that gets how many ids each of the conversation's draft forwards feeds, from now on."""
    draft = conversation.draft
    assert draft is not None
    fed: list[int] = []
    feed = draft.feed

    def counted(tokens, start, logits):  # type: ignore[no-untyped-def]
        fed.append(len(tokens))
        return feed(tokens, start, logits)

    draft.feed = counted  # type: ignore[method-assign]
    return fed


@pytest.mark.parametrize("n_prompt", [8, 30])
def test_the_draft_takes_the_prompt_s_tail_in_its_first_forward(n_prompt: int) -> None:
    """A generation's first block: the prompt's ids the draft has not cached (up to MERGED_FIRST_TAIL) go
    in its first forward, which gives the first drafted token, not in a prefill before it (a forward of 7
    ids costs little more than one of 1 on a CPU). Output unchanged."""
    engine = tiny_engine("llama2", draft_noise=0.0, seed=3)  # the draft is the target: all accepted
    conversation = engine.new_conversation()
    fed = draft_forwards(conversation)
    prompt, params = [int(x) for x in range(1, 2 * n_prompt, 2)], SamplingParams(max_new_tokens=20)
    blocks = conversation.generate(prompt, params, gamma=4)
    first = [next(blocks)]
    assert first[0].n_drafted == 4
    tail = min(n_prompt, MERGED_FIRST_TAIL)  # the rest (a long new prompt) is prefilled before
    assert fed == [n_prompt - tail, tail, 1, 1, 1][n_prompt <= MERGED_FIRST_TAIL :]
    plain = tiny_engine("llama2", draft=None, seed=3)
    assert ids_of([*first, *blocks]) == ids_of(run(plain, prompt, params))


def test_after_a_fully_accepted_block_the_draft_catches_up_in_its_first_forward() -> None:
    """The drafted token the draft never fed (all were accepted) rides along with the bonus token in the
    next block's first draft forward: gamma draft forwards a block, not gamma + 1. Output unchanged."""
    engine = tiny_engine("llama2", draft_noise=0.0, seed=3)  # the draft is the target: all accepted
    conversation = engine.new_conversation()
    fed = draft_forwards(conversation)
    prompt, params = PROMPTS[1], SamplingParams(max_new_tokens=41)
    blocks, marks = [], []
    for block in conversation.generate(prompt, params, gamma=4):
        blocks.append(block)
        marks.append(len(fed))
    forwards = [fed[a:b] for a, b in zip(marks, marks[1:], strict=False)]  # blocks 2.. each
    after_all_accepted = [
        feeds for before, feeds, block in zip(blocks, forwards, blocks[1:], strict=False)
        if before.n_drafted == before.n_accepted == 4 and block.n_drafted == 4
    ]  # fmt: skip
    assert len(after_all_accepted) >= 5 and all(feeds == [2, 1, 1, 1] for feeds in after_all_accepted)
    plain = tiny_engine("llama2", draft=None, seed=3)
    assert ids_of(blocks) == ids_of(run(plain, prompt, params))
