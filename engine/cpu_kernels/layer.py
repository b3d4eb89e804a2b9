"""A decoder layer of the native backend as one call into the kernels' module (engine/cpu_kernels/layer.cpp):
what a forward of a few ids costs without PyTorch's per-operation dispatch (~1,700 small operations a step
of the 0.5B draft)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from engine.cpu_kernels import gguf_mm
from engine.cpu_kernels.linear import GgufKernelLinear

if TYPE_CHECKING:
    from engine.model import Block


def projection(layer: nn.Module) -> Any | None:
    """The kernels' Projection for a GgufKernelLinear, or for a ConcatLinear of them; None where any part is
    held another way (dense, int4): that layer stays on the PyTorch path."""
    parts = list(getattr(layer, "parts", [layer]))  # a ConcatLinear's, or the layer itself
    if not all(isinstance(part, GgufKernelLinear) for part in parts):
        return None
    if len(parts) > 1 and any(part.bias is not None for part in parts):
        return None  # the bias of a ConcatLinear is its own, not its parts'
    bias = getattr(layer, "bias", None)
    packed = [(part.blocks, part.out_features, part.kind) for part in parts]
    return gguf_mm().Projection(packed, None if bias is None else bias.detach())


def native_layer(block: Block) -> Any | None:
    """The whole layer on the kernels (norms, projections, rope, cache writes, attention row by row, SiLU),
    or None where a projection is not on them."""
    attention, ffn = block.attention, block.feed_forward
    projections = [projection(layer) for layer in (attention.wqkv, attention.wo, ffn.w13, ffn.w2)]
    if any(p is None for p in projections):
        return None
    qkv, wo, w13, w2 = projections
    return gguf_mm().NativeLayer(
        block.attention_norm.weight.detach(),
        qkv,
        wo,
        block.ffn_norm.weight.detach(),
        w13,
        w2,
        attention.n_heads,
        attention.n_kv_heads,
        attention.head_dim,
        attention.window or 0,
        block.attention_norm.eps,
    )
