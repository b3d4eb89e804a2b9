"""Prompt-lookup drafts: proposals from the conversation itself, verified like any draft, still exact."""

import pytest
from scipy import stats

from engine import ngram
from engine.generate import Engine, ModelState
from engine.sampling import SamplingParams
from tests.fakes import FakeTokenizer, engine_model_from_hf, tiny_hf_model


def test_the_latest_occurrence_of_the_longest_suffix_is_followed() -> None:
    tokens = [5, 6, 7, 1, 2, 3, 9, 9, 1, 2, 3, 4, 8, 1, 2, 3]
    assert ngram.propose(tokens, 2) == [4, 8]  # "1 2 3" last stood before "4 8"
    assert ngram.propose([1, 2, 3, 4, 2], 3) == [3, 4, 2]  # only "2" matches: what followed it
    assert ngram.propose([1, 2, 3], 4) == []  # nothing repeats
    assert ngram.propose([7, 7], 3) == [7]
    assert ngram.propose(tokens, 0) == []


def ngram_engine(gamma: int | str, draft_model: bool = False) -> Engine:
    target = engine_model_from_hf(tiny_hf_model("qwen2-bias", 3, 0.1), 256)
    return Engine(target, None, FakeTokenizer(), gamma=gamma, ngram_drafts=not draft_model)


@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_greedy_with_ngram_drafts_equals_plain(gamma: int | str) -> None:
    plain = Engine(ngram_engine(0).target, None, FakeTokenizer())
    drafted = ngram_engine(gamma)
    drafted.speculation.calibrate({1: 0.1, 9: 0.1}, draft_step_s=1e-5)  # a large target's costs
    params = SamplingParams(max_new_tokens=48)
    for prompt in ([1, 2, 3, 4, 1, 2, 3], [9, 8, 7, 9, 8]):
        expected = [t for b in plain.new_conversation().generate(prompt, params) for t in b.token_ids]
        blocks = list(drafted.new_conversation().generate(prompt, params))
        assert [t for b in blocks for t in b.token_ids] == expected
    assert drafted.metrics.num_draft_tokens > 0  # the context was proposed from
    assert drafted.metrics.num_accepted_tokens > 0  # and some of it was right


def test_sampling_with_ngram_drafts_follows_the_target() -> None:
    """One-hot draft distributions: the first token after a prompt that repeats itself is distributed as
    the target's (chi-square over many seeds)."""
    engine = ngram_engine(3)
    prompt = [4, 5, 6, 4, 5, 6, 4, 5]  # "4 5" was followed by 6: a proposal exists at once
    state = ModelState(engine.target, engine.target.new_cache())
    logits = state.feed(prompt, 0, "last")
    assert logits is not None
    probs = logits[0].softmax(-1)
    n = 1000
    counts = [0] * probs.shape[0]
    for seed in range(n):
        params = SamplingParams(temperature=1.0, max_new_tokens=2, seed=seed)  # room for one draft
        first = next(iter(engine.new_conversation().generate(prompt, params)))
        counts[first.token_ids[0]] += 1
    likely = [i for i in range(len(counts)) if probs[i] * n >= 5]
    observed = [counts[i] for i in likely] + [n - sum(counts[i] for i in likely)]
    expected = [float(probs[i]) * n for i in likely] + [n - sum(float(probs[i]) * n for i in likely)]
    assert engine.metrics.num_draft_tokens > 0
    assert stats.chisquare(observed, expected).pvalue > 1e-3
