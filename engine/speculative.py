"""Verification of drafted tokens: which are accepted, and the one token the target adds.

Vocabulary (as vLLM's rejection sampler): the draft proposes `draft` tokens; the target's distribution
accepts a prefix of them; the first rejected position is replaced by a `recovered` token sampled from
norm(max(0, p - q)); when all are accepted the target adds a `bonus` token from its next distribution.
Either way each verification commits n_accepted + 1 tokens, distributed exactly as the target alone.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from engine.sampling import sample


class Verdict(NamedTuple):
    n_accepted: int
    next_token: int  # recovered (n_accepted < n_drafted) or bonus (all accepted)


def verify_greedy(draft_tokens: Tensor, target_logits: Tensor) -> Verdict:
    """draft_tokens [G] int64, target_logits [G+1, V] -> the temperature-0 case of rejection sampling.

    A drafted token is accepted iff it is the target's argmax; the target's argmax at the first mismatch
    (or after the last draft) is the next token. Output equals plain greedy decoding of the target.
    """
    n_drafted = draft_tokens.shape[0]
    assert target_logits.shape[0] == n_drafted + 1, (draft_tokens.shape, target_logits.shape)
    target_choice = target_logits.argmax(dim=-1).tolist()  # [G+1]
    drafted = draft_tokens.tolist()
    n_accepted = 0
    while n_accepted < n_drafted and drafted[n_accepted] == target_choice[n_accepted]:
        n_accepted += 1
    return Verdict(n_accepted, target_choice[n_accepted])


def verify_sampled(
    draft_tokens: Tensor, draft_probs: Tensor, target_probs: Tensor, generator: torch.Generator
) -> Verdict:
    """Modified rejection sampling.

    draft_tokens [G] int64, draft_probs q [G, V], target_probs p [G+1, V], both already warped alike.
    Token i is accepted with probability min(1, p_i(x) / q_i(x)); on the first rejection the next token is
    drawn from norm(max(0, p_i - q_i)); if all G are accepted, a bonus token is drawn from p_G.
    """
    n_drafted = draft_tokens.shape[0]
    assert draft_probs.shape[0] == n_drafted and target_probs.shape[0] == n_drafted + 1
    assert draft_probs.shape[-1] == target_probs.shape[-1], (draft_probs.shape, target_probs.shape)
    positions = torch.arange(n_drafted, device=draft_tokens.device)
    p = target_probs[positions, draft_tokens]  # [G]
    q = draft_probs[positions, draft_tokens]  # [G]
    uniform = torch.rand(n_drafted, generator=generator, device=draft_tokens.device)
    accepted = uniform * q < p  # u < p/q without dividing; q > 0 since x was drawn from q
    n_accepted = int(accepted.long().cumprod(dim=0).sum().item()) if n_drafted else 0
    if n_accepted == n_drafted:
        bonus = sample(target_probs[n_drafted : n_drafted + 1], generator)
        return Verdict(n_accepted, int(bonus.item()))
    residual = (target_probs[n_accepted] - draft_probs[n_accepted]).clamp_min(0.0)
    total = residual.sum()
    # The residual is all zero only when p == q up to rounding, where rejection has probability zero:
    # fall back to p itself rather than divide by zero.
    recovery = residual / total if total > 0 else target_probs[n_accepted]
    recovered = sample(recovery[None, :], generator)
    return Verdict(n_accepted, int(recovered.item()))
