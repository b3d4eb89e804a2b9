"""Quantised linear layers: int8 / int4 weight-only on the CPU, fp8 (W8A8) on Hopper-class GPUs.

Decoding one token is bound by reading weights, so smaller weights make a step cheaper: on this project's
CPU an int4 matrix-vector product costs about a quarter of bf16's. That matters most for the draft, whose
cost per drafted token caps the speedup; a quantised draft never changes the output (the target decides
every committed token). A quantised target is a different target: figures must say which one they use.

Activations stay in the model dtype (bf16 or fp32) and the kernels dequantise on the fly, except in W8A8
(int8 on the CPU, fp8 on the GPU), where each row of activations is quantised on the fly too.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from engine.model import Transformer

QuantMode = Literal["none", "int8", "int4", "w8a8", "fp8", "gguf-int4", "gguf-a8"]
QUANT_MODES: tuple[QuantMode, ...] = ("none", "int8", "int4", "w8a8", "fp8", "gguf-int4", "gguf-a8")
# Load options, not roundings of loaded weights: the GGUF's own Q4_K values as int4 (engine/gguf_int4.py),
# and its Q4_K / Q6_K blocks as they are on the engine's own kernel, int8 activations (engine/cpu_kernels).
GGUF_INT4: QuantMode = "gguf-int4"
GGUF_A8: QuantMode = "gguf-a8"
GGUF_LOADS = (GGUF_INT4, GGUF_A8)
INT4_GROUPS = (128, 64, 32)  # group sizes the CPU kernel takes, largest (fewest scales) first
FP8_MAX = 448.0  # largest finite float8_e4m3fn


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


INT8_MAX = 127.0  # symmetric: -127..127, so a value and its negation round alike


class W8A8Linear(nn.Module):
    """int8 weights (one scale per output channel) times int8 activations (one scale per row, set on the fly)
    through `torch._int_mm`: oneDNN's int8 GEMM, on AMX tiles or VNNI where the CPU has them.

    Its cost hardly grows with rows: on an AMX Xeon a 1536x8960 matrix takes the same ~1.4 ms for 1 to 16 rows
    (bound by reading its 13.8 MB), where the int4 weight-only kernel goes from ~0.9 to ~6 ms, so a verify of
    gamma + 1 ids costs about one step. Rows never mix (integer sums are exact, each row has its own scale),
    so a row's output does not depend on the other rows of its forward.
    """

    weight: Tensor  # [N, K] int8, passed to the kernel as its [K, N] view (faster than a [K, N] copy)
    scale: Tensor  # [N] fp32

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        w = weight.float()  # [N, K]
        scale = (w.abs().amax(dim=1) / INT8_MAX).clamp(min=1e-12)  # [N]
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features).float()  # [M, K]
        x_scale = (flat.abs().amax(dim=1, keepdim=True) / INT8_MAX).clamp(min=1e-12)  # [M, 1]
        x_int8 = torch.round(flat / x_scale).to(torch.int8)  # [M, K]
        acc = torch._int_mm(x_int8, self.weight.t())  # [M, N] int32
        y = (acc.float() * x_scale * self.scale).to(self.dtype)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int4Linear(nn.Module):
    """Asymmetric int4 in groups of 128 along K (64 or 32 where K needs it), packed for the CPU kernel.

    Within a group, w ~ (q - 8) * scale + zero with q in [0, 15]; scales_and_zeros is [K/group, N, 2].
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        n, k = weight.shape
        self.group = next((g for g in INT4_GROUPS if k % g == 0), 0)
        if not self.group or n % 16:
            raise ValueError(f"int4 needs in_features divisible by 32 and out_features by 16, got {k}, {n}")
        groups = weight.float().reshape(n, k // self.group, self.group)
        low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        scale = ((high - low) / 15.0).clamp(min=1e-12)  # [N, K/G, 1]
        q = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
        self._store(q, scale[..., 0], (low + 8 * scale)[..., 0], bias, dtype)

    @classmethod
    def from_groups(
        cls, q: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None, dtype: torch.dtype
    ) -> Int4Linear:
        """A layer of given 4-bit values, with no rounding of its own: w = (q - 8) * scale + zero per group.

        q: [N, K] integers in 0..15; scale, zero: [N, K/G] (G = K / their width: 32, 64 or 128). The kernel
        holds scale and zero in `dtype`, so bf16 rounds them; fp32 keeps them as given.
        """
        n, k = q.shape
        assert scale.shape == zero.shape and scale.shape[0] == n and k % scale.shape[1] == 0, scale.shape
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.group = k // scale.shape[1]
        if layer.group not in INT4_GROUPS or n % 16:
            raise ValueError(f"int4 needs groups of {INT4_GROUPS} and out_features in 16s, got {k}, {n}")
        layer._store(q.to(torch.int32), scale.float(), zero.float(), bias, dtype)
        return layer

    def _store(self, q: Tensor, scale: Tensor, zero: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        # q: [N, K] int32 in 0..15; scale, zero: [N, K/G]
        n, k = q.shape
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K/G, N, 2]
        self.register_buffer("weight", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(dtype))
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)
        self.out_features, self.in_features = n, k

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, self.group, self.scales_and_zeros)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Fp8Linear(nn.Module):
    """W8A8 for Hopper-class GPUs: float8_e4m3fn weights with one scale per output channel; activations
    quantised per token on the fly; one `torch._scaled_mm` with a result in the model dtype."""

    weight: Tensor  # [N, K] float8_e4m3fn
    scale: Tensor  # [1, N] fp32

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        w = weight.float()  # [N, K]
        scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)  # [N]
        self.register_buffer("weight", (w / scale[:, None]).to(torch.float8_e4m3fn))
        self.register_buffer("scale", scale[None, :].contiguous())  # [1, N] fp32
        self.bias = None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False)
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        n_rows = flat.shape[0]
        flat = torch.nn.functional.pad(flat, (0, 0, 0, -n_rows % 16))  # cuBLASLt wants rows in 16s
        x_scale = (flat.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)  # [M, 1]
        x_fp8 = (flat.float() / x_scale).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(
            x_fp8, self.weight.t(), scale_a=x_scale, scale_b=self.scale, out_dtype=self.dtype
        )
        y = y[:n_rows].reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def fp8_supported(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def check_device(mode: QuantMode, device: torch.device) -> None:
    if mode in ("int8", "int4", "w8a8", GGUF_INT4, GGUF_A8) and device.type != "cpu":
        raise ValueError(f"{mode} weights run on the CPU kernels only; on {device.type} use bf16 or fp8")
    if mode == "fp8" and not fp8_supported(device):
        raise ValueError("fp8 weights need a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper)")


def quantized_linear(mode: QuantMode, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> nn.Module:
    """The `mode` form of one linear layer (weight [N, K] in any float dtype)."""
    if mode == "int8":
        return Int8Linear(weight, bias, dtype)
    if mode == "int4":
        return Int4Linear(weight, bias, dtype)
    if mode == "w8a8":
        return W8A8Linear(weight, bias, dtype)
    if mode == "fp8":
        return Fp8Linear(weight, bias, dtype)
    if mode in GGUF_LOADS:
        raise ValueError(f"{mode} reads a GGUF's weights at load time: load_engine(quant={mode!r})")
    raise ValueError(f"unknown quantisation {mode!r}; choose one of {', '.join(QUANT_MODES)}")


def quantize(model: Transformer, mode: QuantMode) -> Transformer:
    """Replaces every linear layer, and the output head, by its `mode` form in place; returns the model.

    The token embedding stays in the model dtype (it is a lookup, not a matrix product); a tied head gets
    its own quantised copy.
    """
    if mode == "none":
        return model
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantisation {mode!r}; choose one of {', '.join(QUANT_MODES)}")
    if mode in GGUF_LOADS:
        raise ValueError(f"{mode} reads a GGUF's weights at load time: load_engine(quant={mode!r})")
    check_device(mode, model.device)
    dtype = model.dtype
    for block in model.blocks:
        attention, ffn = block.attention, block.feed_forward
        for owner, name, bias in (
            (attention, "wqkv", attention.wqkv.bias),
            (attention, "wo", None),
            (ffn, "w13", None),
            (ffn, "w2", None),
        ):
            layer = getattr(owner, name)
            setattr(owner, name, quantized_linear(mode, layer.weight, bias, dtype))
    head = model.tok_embeddings.weight if model.output is None else model.output.weight
    assert isinstance(head, Tensor)
    model.output = quantized_linear(mode, head, None, dtype)
    model.quantization = mode
    return model
