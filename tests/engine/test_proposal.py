"""A proposed reply is verified like a draft: the output never changes, only how many forwards it takes."""

from collections.abc import Sequence

import numpy as np
import pytest

from engine.adaptive import SpeculationStats
from engine.generate import CommittedBlock, Engine
from engine.proposal import MAX_PROPOSAL_ROWS, Proposal
from engine.sampling import SamplingParams
from tests.engine.test_sampled_distribution import PROMPT, VOCAB, chi_square_pvalue, exact_pair_distribution
from tests.fakes import TINY_VOCAB, tiny_engine

PROMPTS = [[7], [5, 17, 33, 2, 9], [int(x) for x in range(1, 40, 3)]]


def generate(
    engine: Engine, prompt: list[int], proposal: Sequence[int] = (), gamma: int | str = 0
) -> list[CommittedBlock]:
    params = SamplingParams(max_new_tokens=24)
    return list(engine.new_conversation().generate(prompt, params, gamma=gamma, proposal=proposal))


def ids_of(blocks: list[CommittedBlock]) -> list[int]:
    return [t for b in blocks for t in b.token_ids]


@pytest.mark.parametrize("draft", [None, "perturbed"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_right_reply_is_kept_whole_in_fewer_forwards(draft: str | None, prompt: list[int]) -> None:
    engine = tiny_engine("qwen2-bias", draft=draft, seed=3, init_std=0.1, draft_noise=0.15)
    plain = generate(engine, prompt, gamma=0)
    expected = ids_of(plain)
    proposed = generate(engine, prompt, expected[:16], gamma=0)
    assert ids_of(proposed) == expected
    stats = proposed[-1].stats
    # The last kept id may be the target's own next token rather than a verified one.
    assert stats is not None and stats.n_proposal_kept == 16 and stats.n_proposed <= 16
    assert len(proposed) < len(plain) - 8  # 16 proposed ids took a few forwards, not 16


@pytest.mark.parametrize("diverge_at", [0, 1, 5, 11])
def test_a_reply_to_other_words_keeps_only_what_the_target_would_say(diverge_at: int) -> None:
    engine = tiny_engine("llama2", draft="perturbed", seed=4, init_std=0.1, draft_noise=0.15)
    prompt = PROMPTS[1]
    expected = ids_of(generate(engine, prompt, gamma=0))
    wrong = [*expected[:diverge_at], (expected[diverge_at] + 1) % TINY_VOCAB, *expected[diverge_at + 1 : 18]]
    for gamma in (0, 3, "auto"):
        blocks = generate(engine, prompt, wrong, gamma=gamma)
        assert ids_of(blocks) == expected, gamma
        stats = blocks[-1].stats
        assert stats is not None and stats.n_proposal_kept == diverge_at


def test_a_proposal_longer_than_the_reply_is_cut_at_the_budget() -> None:
    engine = tiny_engine("qwen2-bias", draft=None, seed=5, init_std=0.1)
    expected = ids_of(generate(engine, PROMPTS[0]))
    params = SamplingParams(max_new_tokens=6)
    blocks = list(engine.new_conversation().generate(PROMPTS[0], params, proposal=expected))
    assert ids_of(blocks) == expected[:6]
    assert blocks[-1].finish_reason == "length"


def test_a_conversation_continues_after_a_proposal() -> None:
    """The caches are right after verifying proposals: the next turn equals the same turn without them."""
    engine = tiny_engine("qwen2-bias", draft="perturbed", seed=6, init_std=0.1, draft_noise=0.15)
    with_proposal, without = engine.new_conversation(), engine.new_conversation()
    params = SamplingParams(max_new_tokens=12)
    first = ids_of(list(without.generate(PROMPTS[2], params, gamma=3)))
    assert ids_of(list(with_proposal.generate(PROMPTS[2], params, gamma=3, proposal=first[:9]))) == first
    follow_up = [*PROMPTS[2], *first, 8, 9, 10]
    assert ids_of(list(with_proposal.generate(follow_up, params, gamma=3))) == ids_of(
        list(without.generate(follow_up, params, gamma=3))
    )


def test_a_proposed_id_outside_the_vocabulary_is_refused() -> None:
    engine = tiny_engine("qwen2-bias", draft=None, seed=5, init_std=0.1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.new_conversation().generate([1, 2], SamplingParams(), proposal=[1, 10**9])


def test_sampled_output_with_a_proposal_follows_the_target() -> None:
    """A fixed (here: often wrong) proposal must not bend the sampled distribution."""
    engine = tiny_engine("qwen2-bias", draft=None, seed=21, init_std=0.3, vocab_size=VOCAB)
    params = SamplingParams(temperature=1.0)
    conversation = engine.new_conversation()
    counts = np.zeros(VOCAB * VOCAB)
    for seed in range(2500):
        sample = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=2)
        ids = [t for b in conversation.generate(PROMPT, sample, proposal=[2, 5]) for t in b.token_ids]
        counts[ids[0] * VOCAB + ids[1]] += 1
    assert chi_square_pvalue(counts, exact_pair_distribution(engine.target, params)) > 1e-3
    assert 0 < counts[2 * VOCAB + 5] < 2500  # the proposal was both taken and refused


def test_block_length_follows_the_verify_costs() -> None:
    """With rows that cost little beyond the first, a block takes many proposed ids; with rows that
    cost a step each, it takes one; it never exceeds the row cap."""
    cheap, linear = SpeculationStats(), SpeculationStats()
    cheap.calibrate({1: 0.08, 2: 0.085, 9: 0.12}, None)
    linear.calibrate({1: 0.08, 2: 0.17, 9: 0.8}, None)
    assert len(Proposal(range(30)).take(0, 1, 100, cheap)) == MAX_PROPOSAL_ROWS - 1
    assert len(Proposal(range(30)).take(0, 1, 100, linear)) == 1
    assert len(Proposal(range(30)).take(0, 12, 100, cheap)) == MAX_PROPOSAL_ROWS - 12
    assert Proposal(range(30)).take(0, 1, 0, cheap) == []
