"""Weight-only quantisation of the linear layers (CPU): int8 per output channel, int4 in groups.

Decoding one token is bound by reading weights, so smaller weights make a step cheaper: on this project's
CPU an int4 matrix-vector product costs about a quarter of bf16's. That matters most for the draft, whose
cost per drafted token caps the speedup; a quantised draft never changes the output (the target decides
every committed token). A quantised target is a different target: figures must say which one they use.

Activations stay in the model dtype (bf16 or fp32); the kernels dequantise on the fly.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from engine.model import Transformer

QuantMode = Literal["none", "int8", "int4"]
QUANT_MODES: tuple[QuantMode, ...] = ("none", "int8", "int4")
INT4_GROUP = 128


class Int8Linear(nn.Module):
    """y = x @ (q * scale)^T + b with q int8 [N, K] and one scale per output channel."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        w = weight.float()  # [N, K]
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [N]
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(dtype))
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)
        self.out_features, self.in_features = weight.shape

    def forward(self, x: Tensor) -> Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features), self.weight, self.scale)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int4Linear(nn.Module):
    """Asymmetric int4 in groups of 128 along K, packed for the CPU kernel.

    Within a group, w ~ (q - 8) * scale + zero with q in [0, 15]; scales_and_zeros is [K/128, N, 2].
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        n, k = weight.shape
        if k % INT4_GROUP:
            raise ValueError(f"int4 needs in_features divisible by {INT4_GROUP}, got {k}")
        groups = weight.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
        low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        scale = ((high - low) / 15.0).clamp(min=1e-12)  # [N, K/G, 1]
        q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        zero = low + 8 * scale
        scales_and_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K/G, N, 2]
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(dtype))
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)
        self.out_features, self.in_features = n, k

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, INT4_GROUP, self.scales_and_zeros)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def quantize(model: Transformer, mode: QuantMode) -> Transformer:
    """Replaces every linear layer, and the output head, by its `mode` form in place; returns the model.

    The token embedding stays in the model dtype (it is a lookup, not a matrix product); a tied head gets
    its own quantised copy.
    """
    if mode == "none":
        return model
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantisation {mode!r}; choose one of {', '.join(QUANT_MODES)}")
    if model.device.type != "cpu":
        raise ValueError(
            f"{mode} weights run on the CPU kernels only; on {model.device.type} use bf16 or fp8"
        )
    make = Int8Linear if mode == "int8" else Int4Linear
    dtype = model.dtype
    for block in model.blocks:
        attention, ffn = block.attention, block.feed_forward
        attention.wqkv = make(attention.wqkv.weight, attention.wqkv.bias, dtype)  # type: ignore[assignment]
        attention.wo = make(attention.wo.weight, None, dtype)  # type: ignore[assignment]
        ffn.w13 = make(ffn.w13.weight, None, dtype)  # type: ignore[assignment]
        ffn.w2 = make(ffn.w2.weight, None, dtype)  # type: ignore[assignment]
    head = model.tok_embeddings.weight if model.output is None else model.output.weight
    assert isinstance(head, Tensor)
    model.output = make(head, None, dtype)
    model.quantization = mode
    return model
