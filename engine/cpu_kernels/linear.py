"""A linear layer on the engine's CPU kernels: the GGUF's blocks as they are, int8 activations."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from engine.cpu_kernels import gguf_mm
from engine.cpu_kernels.pack import PackedMatrix


def kernel_product(x: Tensor, blocks: Tensor, n: int, kind: str) -> Tensor:
    """x [M, K] float times the packed matrix of `kind` -> [M, N] float32: activations rounded to int8
    per 256 inputs for K-quants (llama.cpp's Q8_K), per 32 for Q4_0 / Q8_0 (its Q8_0)."""
    if kind in ("Q4_K", "Q6_K"):
        return gguf_mm().linear(x, blocks, n, kind == "Q6_K")
    return gguf_mm().linear32(x, blocks, n, kind == "Q8_0")


class GgufKernelLinear(nn.Module):
    """y = x @ W^T (+ bias) for W one packed matrix [N, K]: the file's own 4-, 6- or 8-bit values and
    scales; each row of x rounded to int8 as `kernel_product` says; float32, cast back to x's dtype."""

    blocks: Tensor  # [N / 16, K / 256 (K / 32 for Q4_0, Q8_0), block bytes] uint8

    bias: Tensor | None  # set by the loader where the file has one (q, k, v)

    def __init__(self, packed: PackedMatrix) -> None:
        super().__init__()
        self.register_buffer("blocks", torch.from_numpy(np.ascontiguousarray(packed.blocks)))
        self.out_features, self.in_features, self.kind = packed.n, packed.k, packed.kind
        self.bias = None
        gguf_mm()  # build or load the kernel now, not in the first forward

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)  # [M, K]
        y = kernel_product(flat, self.blocks, self.out_features, self.kind)  # [M, N] fp32
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.kind}, in_features={self.in_features}, out_features={self.out_features}"


class SubsetHead(nn.Module):
    """A draft's output head over a subset of the vocabulary (its most frequent ids): logits [.., V] with
    -inf outside the subset. Only a draft may use it: the target still decides every token, and under
    rejection sampling a draft distribution that gives some ids no mass keeps the output exact."""

    ids: Tensor  # [S] int64, the vocabulary ids the head scores

    def __init__(self, head: GgufKernelLinear, ids: Tensor, vocab_size: int) -> None:
        super().__init__()
        assert head.out_features == ids.numel(), (head.out_features, ids.numel())
        self.head, self.vocab_size = head, vocab_size
        self.register_buffer("ids", ids.to(torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        scores = self.head(x)  # [..., S]
        full = scores.new_full((*scores.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.ids, scores)
