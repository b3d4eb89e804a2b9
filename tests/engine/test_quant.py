"""Quantised layers (weight-only int8/int4, W8A8): close to their dequantised weights, exact as a draft, and
a quantised target exact under speculation."""

import pytest
import torch

from engine.quant import Int4Linear, Int8Linear, W8A8Linear, quantize
from engine.sampling import SamplingParams
from tests.fakes import engine_model_from_hf, tiny_engine, tiny_hf_model


def dequantised_int4(layer: Int4Linear, weight: torch.Tensor) -> torch.Tensor:
    """The weight the int4 kernel multiplies by, rebuilt the way the quantiser defines it."""
    n, k = weight.shape
    groups = weight.float().reshape(n, k // layer.group, layer.group)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((groups - low) / scale).clamp(0, 15)
    return ((q - 8) * scale + (low + 8 * scale)).reshape(n, k)


@pytest.mark.parametrize("in_features", [256, 576])  # groups of 128, and of 64 where 128 does not divide
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_layer_computes_with_its_dequantised_weight(dtype: torch.dtype, in_features: int) -> None:
    weight, bias = torch.randn(96, in_features), torch.randn(96)
    x = torch.randn(5, in_features).to(dtype)
    layer = Int4Linear(weight, bias, dtype)
    expected = x.float() @ dequantised_int4(layer, weight).t() + bias
    tolerance = 1e-3 if dtype == torch.float32 else 0.5  # bf16 activations and outputs
    torch.testing.assert_close(layer(x).float(), expected, rtol=0.02, atol=tolerance)
    # and the quantisation error itself is bounded by half a step of each group
    assert (dequantised_int4(layer, weight) - weight).abs().max() < (weight.max() - weight.min()) / 15


def test_int8_layer_computes_with_its_dequantised_weight() -> None:
    weight = torch.randn(64, 96)
    x = torch.randn(3, 96)
    layer = Int8Linear(weight, None, torch.float32)
    dequantised = layer.weight.float() * layer.scale[:, None]
    torch.testing.assert_close(layer(x), x @ dequantised.t(), rtol=1e-4, atol=1e-4)
    assert ((dequantised - weight).abs() <= layer.scale[:, None] / 2 + 1e-6).all()  # half a step at most


def test_w8a8_layer_computes_with_its_dequantised_weight_and_rows_never_mix() -> None:
    weight, bias = torch.randn(48, 96), torch.randn(48)
    x = torch.randn(6, 96)
    layer = W8A8Linear(weight, bias, torch.float32)
    dequantised = layer.weight.float() * layer.scale[:, None]
    assert ((dequantised - weight).abs() <= layer.scale[:, None] / 2 + 1e-6).all()  # half a step at most
    x_scale = x.abs().amax(dim=1, keepdim=True) / 127  # each row rounded to 1/127 of its largest value
    x_rounded = torch.round(x / x_scale) * x_scale
    assert ((x_rounded - x).abs() <= x_scale / 2 + 1e-6).all()
    torch.testing.assert_close(layer(x), x_rounded @ dequantised.t() + bias, rtol=1e-4, atol=1e-4)
    together = layer(x)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    assert torch.equal(together, alone)  # what a verify gives a row is what a one-id step gives it


def test_int4_needs_whole_groups() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        Int4Linear(torch.randn(8, 100), None, torch.float32)
    with pytest.raises(ValueError, match="out_features by 16"):
        Int4Linear(torch.randn(8, 128), None, torch.float32)
    assert Int4Linear(torch.randn(16, 576), None, torch.float32).group == 64  # SmolLM2's width


def test_unknown_mode() -> None:
    model = engine_model_from_hf(tiny_hf_model("llama2"))
    with pytest.raises(ValueError, match="unknown quantisation 'int2'"):
        quantize(model, "int2")  # type: ignore[arg-type]


WIDE = {"hidden_size": 128, "intermediate_size": 256}  # int4 groups of 128 along every input dimension


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantised_draft_keeps_the_output_exact(mode: str) -> None:
    plain = tiny_engine("qwen2-bias", draft=None, seed=2, init_std=0.1, **WIDE)
    speculative = tiny_engine("qwen2-bias", seed=2, init_std=0.1, draft_noise=0.1, **WIDE)
    assert speculative.draft is not None
    quantize(speculative.draft, mode)  # type: ignore[arg-type]
    params = SamplingParams(max_new_tokens=40)
    for prompt in ([1, 2, 3], [50, 9, 9, 31, 7]):
        expected = [t for b in plain.new_conversation().generate(prompt, params) for t in b.token_ids]
        blocks = list(speculative.new_conversation().generate(prompt, params, gamma=4))
        assert [t for b in blocks for t in b.token_ids] == expected
    assert speculative.metrics.acceptance_rate > 0.3


@pytest.mark.parametrize("mode", ["int4", "w8a8"])
def test_a_quantised_target_follows_its_own_logits(mode: str) -> None:
    """A quantised target is a different model; speculative decoding is exact with respect to it."""
    target_only = tiny_engine("qwen2-bias", draft=None, seed=3, init_std=0.1, **WIDE)
    speculative = tiny_engine("qwen2-bias", seed=3, init_std=0.1, draft_noise=0.1, **WIDE)
    quantize(target_only.target, mode)  # type: ignore[arg-type]
    quantize(speculative.target, mode)  # type: ignore[arg-type]
    params = SamplingParams(max_new_tokens=30)
    expected = [t for b in target_only.new_conversation().generate([4, 5, 6], params) for t in b.token_ids]
    got = [
        t for b in speculative.new_conversation().generate([4, 5, 6], params, gamma=3) for t in b.token_ids
    ]
    assert got == expected
