"""Sampled speculative output follows the target's own distribution (a small vocabulary, many samples)."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine.generate import Engine
from engine.model import Transformer
from engine.sampling import SamplingParams, warp_probs
from tests.fakes import tiny_engine

VOCAB = 8
PROMPT = [3, 1, 4, 1]


def next_token_probs(model: Transformer, prefix: list[int], params: SamplingParams) -> torch.Tensor:
    """The target's exact (warped) next-token distribution after `prefix`: [V]."""
    logits = model(torch.tensor(prefix), torch.arange(len(prefix)), model.new_cache(), kv_len=len(prefix))
    assert logits is not None
    return warp_probs(logits[-1:], params)[0].double()


def exact_pair_distribution(model: Transformer, params: SamplingParams) -> np.ndarray:
    """P(x1, x2 | prompt) for every pair: [V * V]."""
    first = next_token_probs(model, PROMPT, params)
    rows = [first[x1] * next_token_probs(model, [*PROMPT, x1], params) for x1 in range(VOCAB)]
    return torch.cat(rows).numpy()


def sampled_pair_counts(engine: Engine, params: SamplingParams, n: int) -> np.ndarray:
    conversation = engine.new_conversation()
    counts = np.zeros(VOCAB * VOCAB)
    for seed in range(n):
        sample = SamplingParams(**{**params.__dict__, "seed": seed, "max_new_tokens": 2})
        ids = [t for block in conversation.generate(PROMPT, sample) for t in block.token_ids]
        counts[ids[0] * VOCAB + ids[1]] += 1
    return counts


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Cells expected fewer than 5 times are pooled so the chi-square approximation holds."""
    expected = probs / probs.sum() * counts.sum()
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    keep = expected > 0
    return float(chisquare(observed[keep], expected[keep]).pvalue)


@pytest.mark.parametrize(
    ("params", "draft"),
    [
        (SamplingParams(temperature=1.0), "perturbed"),
        (SamplingParams(temperature=1.0), "independent"),
        (SamplingParams(temperature=0.7, top_k=5, top_p=0.9), "perturbed"),
        (SamplingParams(temperature=1.0), None),
    ],
    ids=["t1-close-draft", "t1-unrelated-draft", "t0.7-topk-topp", "plain"],
)
def test_two_token_sequences_follow_the_target(params: SamplingParams, draft: str | None) -> None:
    engine = tiny_engine(
        "qwen2-bias", draft=draft, seed=21, init_std=0.3, draft_noise=0.5, gamma=3, vocab_size=VOCAB
    )
    probs = exact_pair_distribution(engine.target, params)
    counts = sampled_pair_counts(engine, params, n=2500)
    assert chi_square_pvalue(counts, probs) > 1e-3
    if draft is not None:  # the test is only meaningful if drafts were both accepted and rejected
        metrics = engine.metrics
        assert 0.1 < metrics.acceptance_rate < 0.95, metrics.acceptance_rate


def test_the_check_detects_a_wrong_distribution() -> None:
    """The same check rejects samples of the draft model: the test has the power to catch a bug."""
    engine = tiny_engine("qwen2-bias", draft="independent", seed=21, init_std=0.3, vocab_size=VOCAB)
    params = SamplingParams(temperature=1.0)
    assert engine.draft is not None
    counts = sampled_pair_counts(engine, params, n=2500)
    assert chi_square_pvalue(counts, exact_pair_distribution(engine.draft, params)) < 1e-6
