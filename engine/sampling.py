"""Sampling parameters and the warp (temperature, top-k, top-p) applied alike to target and draft."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. `temperature == 0` is greedy (argmax); top-k 0 and top-p 1.0 disable those."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = field(default=())
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str) or not isinstance(self.stop, tuple | list):
            raise ValueError(f"stop must be a list of strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.temperature, int | float) or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [N, V] fp32 -> probabilities [N, V] after temperature, top-k and top-p (in that order)."""
    assert logits.ndim == 2, logits.shape
    assert not params.greedy, "greedy decoding takes the argmax, not probabilities"
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]  # [N, 1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [N, V]
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def sample(probs: Tensor, generator: torch.Generator) -> Tensor:
    """probs [N, V] -> token ids [N] int64."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
