"""The verifier on hand-built cases, and its output distribution against the target's."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine.sampling import SamplingParams, warp_probs
from engine.speculative import Verdict, verify_greedy, verify_sampled


def one_hot(index: int, vocab: int = 6) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(index), vocab).float()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_all_accepted_adds_the_bonus_token() -> None:
    draft = torch.tensor([2, 4, 1])
    target_logits = torch.stack([one_hot(2), one_hot(4), one_hot(1), one_hot(5)])
    assert verify_greedy(draft, target_logits) == Verdict(3, 5)


def test_greedy_first_and_middle_rejections() -> None:
    target_logits = torch.stack([one_hot(2), one_hot(4), one_hot(1), one_hot(5)])
    assert verify_greedy(torch.tensor([3, 4, 1]), target_logits) == Verdict(0, 2)
    assert verify_greedy(torch.tensor([2, 4, 0]), target_logits) == Verdict(2, 1)
    assert verify_greedy(torch.empty(0, dtype=torch.long), target_logits[:1]) == Verdict(0, 2)


def test_sampled_all_accepted_adds_a_bonus_from_the_last_target_distribution() -> None:
    # p(x) >= q(x) for every drafted x: acceptance is certain whatever the uniform draws are.
    draft = torch.tensor([1, 2])
    q = torch.stack([one_hot(1), one_hot(2)])
    p = torch.stack([one_hot(1), one_hot(2), one_hot(4)])
    for seed in range(20):
        assert verify_sampled(draft, q, p, gen(seed)) == Verdict(2, 4)


def test_sampled_first_rejected_recovers_from_the_residual() -> None:
    # p gives the drafted token 0 probability: always rejected; norm(max(0, p - q)) is token 3 only.
    draft = torch.tensor([1, 2])
    q = torch.stack([torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0, 0.0]), one_hot(2)])
    p = torch.stack([torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0, 0.0]), one_hot(2), one_hot(4)])
    for seed in range(20):
        assert verify_sampled(draft, q, p, gen(seed)) == Verdict(0, 3)


def test_sampled_middle_rejected() -> None:
    draft = torch.tensor([1, 2, 5])
    q = torch.stack([one_hot(1), one_hot(2), torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.5])])
    p = torch.stack([one_hot(1), one_hot(2), one_hot(4), one_hot(0)])
    for seed in range(20):
        assert verify_sampled(draft, q, p, gen(seed)) == Verdict(2, 4)


def test_identical_distributions_accept_everything() -> None:
    probs = torch.softmax(torch.randn(4, 6, generator=gen(1)), dim=-1)
    draft = torch.multinomial(probs[:3], 1, generator=gen(2)).squeeze(-1)
    assert verify_sampled(draft, probs[:3], probs, gen(3)).n_accepted == 3


@pytest.mark.parametrize("n_drafted", [1, 3])
def test_first_committed_token_follows_the_target(n_drafted: int) -> None:
    """Over many draws, the first committed token is distributed as p, whatever q is."""
    vocab, trials = 6, 30000
    rng = gen(11)
    p = torch.softmax(2 * torch.randn(n_drafted + 1, vocab, generator=rng), dim=-1)
    q = torch.softmax(2 * torch.randn(n_drafted, vocab, generator=rng), dim=-1)
    counts = np.zeros(vocab)
    for _ in range(trials):
        draft = torch.multinomial(q, 1, generator=rng).squeeze(-1)
        verdict = verify_sampled(draft, q, p, rng)
        first = int(draft[0]) if verdict.n_accepted >= 1 else verdict.next_token
        counts[first] += 1
    expected = p[0].double().numpy()
    expected = expected / expected.sum() * trials
    assert chisquare(counts, expected).pvalue > 1e-3


def test_top_k_and_top_p_warp() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    top_k = warp_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(top_k, torch.tensor([[5 / 7, 2 / 7, 0.0, 0.0, 0.0]]))
    top_p = warp_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.2 + 0.15 reaches 0.8
    torch.testing.assert_close(top_p, torch.tensor([[0.5, 0.2, 0.15, 0.0, 0.0]]) / 0.85)
    sharp = warp_probs(logits, SamplingParams(temperature=0.5))
    torch.testing.assert_close(sharp, torch.softmax(2 * logits, dim=-1))
