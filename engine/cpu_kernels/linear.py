"""A linear layer on the engine's CPU kernel: the GGUF's Q4_K / Q6_K blocks as they are, int8 activations."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from engine.cpu_kernels import gguf_mm
from engine.cpu_kernels.pack import PackedMatrix


class GgufKernelLinear(nn.Module):
    """y = x @ W^T (+ bias) for W one packed matrix [N, K]: the file's own 4- or 6-bit values and scales.

    Each row of x is rounded to int8 per 256 inputs (llama.cpp rounds its activations the same way, Q8_K);
    the result is float32, cast back to x's dtype.
    """

    blocks: Tensor  # [N / 16, K / 256, block bytes] uint8

    def __init__(self, packed: PackedMatrix, bias: Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("blocks", torch.from_numpy(np.ascontiguousarray(packed.blocks)))
        self.out_features, self.in_features, self.q6 = packed.n, packed.k, packed.q6
        self.bias = None if bias is None else nn.Parameter(bias.float(), requires_grad=False)
        gguf_mm()  # build or load the kernel now, not in the first forward

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)  # [M, K]
        y = gguf_mm().linear(flat, self.blocks, self.out_features, self.q6)  # [M, N] fp32
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        kind = "Q6_K" if self.q6 else "Q4_K"
        return f"{kind}, in_features={self.in_features}, out_features={self.out_features}"
