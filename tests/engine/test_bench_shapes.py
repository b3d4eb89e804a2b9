"""Random-weight timing of real shapes: the model builds, the static steps run, the projection adds up."""

import pytest
import torch

from engine.bench.shapes import expected_tokens, project, random_model, run_shapes
from engine.config import NAMED_SHAPES, ModelArgs
from engine.quant import Fp8Linear, fp8_supported

TINY = ModelArgs(
    vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=256, head_dim=32
)


def test_expected_tokens_per_block() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_projection_picks_the_cheapest_gamma() -> None:
    verify = {n: 10.0 + 0.5 * (n - 1) for n in range(1, 10)}  # a memory-bound verify: nearly flat
    rows = project(draft_ms=1.0, verify_ms=verify, max_gamma=8)
    by_rate = {row["acceptance"]: row for row in rows}
    assert by_rate[0.9]["best_gamma"] > by_rate[0.5]["best_gamma"]
    assert by_rate[0.9]["speedup"] > 2.5
    row = by_rate[0.8]
    gamma = row["best_gamma"]
    assert row["ms_per_token"] == pytest.approx(
        (gamma * 1.0 + verify[gamma + 1]) / expected_tokens(0.8, gamma)
    )


def test_random_model_has_the_real_parameter_count() -> None:
    model = random_model(TINY, max_seq_len=64, weights="none", device="cpu")
    counted = sum(p.numel() for p in model.parameters())
    assert counted == TINY.n_params  # TINY has an untied head, as the random model always builds one
    logits = model(torch.arange(5), torch.arange(5), model.new_cache(), 5)
    assert logits is not None and logits.shape == (5, 512) and torch.isfinite(logits).all()


def test_run_shapes_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(NAMED_SHAPES, "tiny-target", TINY)
    monkeypatch.setitem(NAMED_SHAPES, "tiny-draft", ModelArgs(512, 64, 1, 2, 1, 128, 32))
    result = run_shapes(
        "tiny-target:tiny-draft", "none", "cpu", max_gamma=3, context=32, repeats=3, log=print
    )
    assert set(result["verify_ms"]) == {1, 2, 3, 4}
    assert result["draft_ms"] > 0 and len(result["projection"]) == 5


def test_unknown_shapes() -> None:
    with pytest.raises(ValueError, match="--shapes wants TARGET:DRAFT"):
        run_shapes("llama3-70b:gpt-5", "none", "cpu", 2, 8, 1, print)


def test_named_shapes_are_the_real_ones() -> None:
    assert NAMED_SHAPES["llama3-70b"].n_params == pytest.approx(70.55e9, rel=0.01)
    assert NAMED_SHAPES["llama3-8b"].n_params == pytest.approx(8.03e9, rel=0.01)
    assert NAMED_SHAPES["qwen2.5-1.5b"].n_params == pytest.approx(1.54e9, rel=0.01)


needs_fp8 = pytest.mark.skipif(
    not torch.cuda.is_available() or not fp8_supported(torch.device("cuda")), reason="needs an fp8 GPU"
)


@pytest.mark.gpu
@needs_fp8
def test_fp8_linear_is_close_to_bf16() -> None:
    weight = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(3, 1024, device="cuda", dtype=torch.bfloat16)
    layer = Fp8Linear(weight, None, torch.bfloat16)
    expected = x.float() @ weight.float().t()
    got = layer(x).float()
    assert ((got - expected).norm() / expected.norm()).item() < 0.05


@pytest.mark.gpu
@needs_fp8
def test_fp8_random_shapes_on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_shapes("llama3-1b:llama3-1b", "fp8", "cuda", max_gamma=2, context=64, repeats=3, log=print)
    assert result["gpu"] and result["draft_ms"] > 0
