"""The engine's CPU kernels (engine/cpu_kernels): the file's quantised values (Q4_K, Q6_K, Q4_0, Q8_0),
rearranged, times int8 rows.

What must hold: packing loses nothing (gguf's own dequantisation equals the packed blocks' values); the
product equals the exact product of the dequantised weights and the int8-rounded activations (only float
summation order differs); the vector path equals the scalar one; and a row's output does not depend on the
other rows of its call (what makes a verify of gamma + 1 ids agree with decoding them one by one).
"""

from __future__ import annotations

import platform
import threading
import time

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.cpu_kernels import _variant_from_environment, gguf_mm
from engine.cpu_kernels.linear import kernel_product
from engine.cpu_kernels.pack import (
    Q4_0_BLOCK_BYTES,
    Q6K_BLOCK_BYTES,
    Q8_0_BLOCK_BYTES,
    PackCache,
    pack_q4_0,
    pack_q4k,
    pack_q6k,
    pack_q8_0,
    unpack_q6k,
)
from engine.q4k import Q4K_BLOCK_BYTES, SUPER_BLOCK


def random_q4k(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // SUPER_BLOCK, Q4K_BLOCK_BYTES), dtype=np.uint8)
    scales = rng.uniform(1e-4, 3e-3, size=(raw.shape[0], 2)).astype(np.float16)  # d, dmin
    raw[:, 0:4] = scales.view(np.uint8)
    return raw.reshape(n, -1)


def random_q6k(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // SUPER_BLOCK, Q6K_BLOCK_BYTES), dtype=np.uint8)
    d = rng.uniform(1e-4, 1e-3, size=(raw.shape[0], 1)).astype(np.float16)
    raw[:, 208:210] = d.view(np.uint8)
    return raw.reshape(n, -1)


def dense(raw: np.ndarray, kind: GGMLQuantizationType) -> torch.Tensor:
    return torch.from_numpy(np.asarray(dequantize(raw, kind), dtype=np.float64).copy())


def random_group32(block_bytes: int):
    def make(n: int, k: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        raw = rng.integers(0, 256, size=(n * k // 32, block_bytes), dtype=np.uint8)
        raw[:, 0:2] = rng.uniform(1e-4, 1e-2, size=(raw.shape[0], 1)).astype(np.float16).view(np.uint8)
        return raw.reshape(n, -1)

    return make


GROUP32 = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0)


def quantized(module, x: torch.Tensor, kind: GGMLQuantizationType):
    """The kernel's int8 rows for `kind` (per 256 inputs for K-quants, per 32 else) and the float64 values
    they stand for."""
    if kind in GROUP32:
        xq, xs, xsum = module.quantize_rows32(x)
        width = 32
    else:
        xq, xs, xsum = module.quantize_rows(x)
        width = SUPER_BLOCK
    values = xq.double().reshape(x.shape[0], -1, width) * xs.double()[..., None]
    return xq, xs, xsum, values.reshape(x.shape)


def product(module, rows, blocks: torch.Tensor, n: int, kind: GGMLQuantizationType, simd: bool = True):
    xq, xs, xsum = rows[:3]
    if kind in GROUP32:
        return module.matmul32(xq, xs, xsum, blocks, n, kind == GGMLQuantizationType.Q8_0, simd)
    return module.matmul(xq, xs, xsum, blocks, n, kind == GGMLQuantizationType.Q6_K, simd)


CASES = [
    (GGMLQuantizationType.Q4_K, random_q4k, pack_q4k),
    (GGMLQuantizationType.Q6_K, random_q6k, pack_q6k),
    (GGMLQuantizationType.Q4_0, random_group32(Q4_0_BLOCK_BYTES), pack_q4_0),
    (GGMLQuantizationType.Q8_0, random_group32(Q8_0_BLOCK_BYTES), pack_q8_0),
]
IDS = ["q4k", "q6k", "q4_0", "q8_0"]


@pytest.mark.parametrize(("kind", "make", "pack"), CASES, ids=IDS)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])
def test_the_product_is_the_files_weights_times_the_rounded_rows(kind, make, pack, rows: int) -> None:
    n, k = 48, 768
    raw = make(n, k, seed=rows)
    packed = pack(raw, n, k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    rounded = quantized(gguf_mm(), x, kind)
    expected = rounded[3] @ dense(raw, kind).T  # [M, N] float64
    blocks = torch.from_numpy(packed.blocks)
    for simd in (True, False):
        y = product(gguf_mm(), rounded, blocks, n, kind, simd)
        assert y.shape == (rows, n) and y.dtype == torch.float32
        torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize(("kind", "make", "pack"), CASES, ids=IDS)
def test_a_row_s_output_does_not_depend_on_the_rows_beside_it(kind, make, pack) -> None:
    n, k = 32, 896 if kind in GROUP32 else 512  # 896: the 0.5B draft's width, which no K-quant divides
    packed = pack(make(n, k, seed=7), n, k)
    blocks = torch.from_numpy(packed.blocks)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(3))
    together = kernel_product(x, blocks, n, packed.kind)
    for i in range(x.shape[0]):
        alone = kernel_product(x[i : i + 1], blocks, n, packed.kind)
        assert torch.equal(alone[0], together[i]), i
    assert torch.equal(kernel_product(x[2:9], blocks, n, packed.kind), together[2:9])


@pytest.mark.parametrize(("kind", "make", "pack"), CASES[:2], ids=IDS[:2])
def test_rows_at_full_scale_give_the_exact_product(kind, make, pack) -> None:
    """Rows whose every value rounds to +-127: a group's sum of int8 values is then +-4064, the most the
    kernels' 16-bit multiply-adds of the mins (MinPairs in gguf_mm.cpp) must hold, and the largest dot
    products. The product is still the exact one, and the AVX2 build's the same bits."""
    n, k = 32, 512
    raw = make(n, k, seed=11)
    blocks = torch.from_numpy(pack(raw, n, k).blocks)
    x = torch.ones(4, k)
    x[1] = -1.0
    x[2, ::2] = -1.0  # alternating signs
    x[3, :256], x[3, 256:] = 1.0, -1.0  # one super-block each way
    rounded = quantized(gguf_mm(), x, kind)
    assert rounded[0].abs().min() == 127
    expected = rounded[3] @ dense(raw, kind).T
    y = product(gguf_mm(), rounded, blocks, n, kind)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    if platform.machine() == "x86_64":
        assert torch.equal(product(gguf_mm("avx2"), rounded, blocks, n, kind), y)


def test_q6k_unpacking_equals_gguf_s_dequantisation() -> None:
    n, k = 16, 512
    raw = random_q6k(n, k, seed=1)
    q, sc, d = unpack_q6k(raw, n, k)
    mine = d.astype(np.float64).repeat(256, axis=1) * sc.astype(np.float64).repeat(16, axis=1) * (q - 32.0)
    np.testing.assert_allclose(mine, dense(raw, GGMLQuantizationType.Q6_K).numpy(), rtol=1e-6, atol=0)


def test_rows_round_to_nearest_within_each_super_block() -> None:
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(0)) * 3
    x[1, 256:] = 0  # an all-zero block: scale 0, values 0
    xq, xs, xsum = gguf_mm().quantize_rows(x)
    assert xq.abs().max() == 127 and xs[1, 1] == 0 and not xq[1, 256:].any()
    blocks = x.reshape(2, 2, SUPER_BLOCK)
    assert torch.allclose(xs, blocks.abs().amax(-1) / 127)
    assert (xq.reshape(2, 2, SUPER_BLOCK).double() * xs.double()[..., None] - blocks).abs().max() <= (
        xs.max() / 2 + 1e-6
    )
    assert torch.equal(xsum, xq.reshape(2, -1, 16).sum(-1, dtype=torch.int32))


def test_bad_shapes_get_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="multiple of 256"):
        gguf_mm().quantize_rows(torch.zeros(1, 100))
    with pytest.raises(ValueError, match="K in 256s"):
        pack_q4k(random_q4k(16, 256, 0), 16, 100)
    xq, xs, xsum = gguf_mm().quantize_rows(torch.zeros(1, 256))
    with pytest.raises(RuntimeError, match="blocks"):
        gguf_mm().matmul(xq, xs, xsum, torch.zeros(10, dtype=torch.uint8), 16, False, True)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the AVX2 and SSE2 builds are x86-64 code")
@pytest.mark.parametrize(("variant", "isa"), [("avx2", "avx2"), ("scalar", "scalar")])
@pytest.mark.parametrize(("kind", "make", "pack"), CASES, ids=IDS)
def test_older_cpus_code_paths_give_the_same_product(variant: str, isa: str, kind, make, pack) -> None:
    """The build an AVX2-only CPU (AMD EPYC without AVX-512) or any other CPU runs, tested on this one."""
    module = gguf_mm(variant)
    assert module.isa() == isa
    n, k = 32, 512
    raw = make(n, k, seed=5)
    packed = pack(raw, n, k)
    blocks = torch.from_numpy(packed.blocks)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(5))
    rounded = quantized(module, x, kind)
    expected = rounded[3] @ dense(raw, kind).T
    y = product(module, rounded, blocks, n, kind)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    native = product(gguf_mm(), rounded, blocks, n, kind)
    if isa == "avx2":  # the same operations in the same order on narrower vectors
        assert torch.equal(y, native)


def test_a_matrix_is_packed_once_and_read_back_the_same(tmp_path) -> None:
    raw = random_q6k(32, 512, seed=2)
    made: list[int] = []

    def make():
        made.append(1)
        return pack_q6k(raw, 32, 512)

    first = PackCache(tmp_path).get("blk.0.ffn_down.weight", make)
    again = PackCache(tmp_path).get("blk.0.ffn_down.weight", make)
    assert len(made) == 1 and (again.n, again.k, again.q6) == (32, 512, True)
    assert np.array_equal(again.blocks, first.blocks)
    assert not list(tmp_path.glob("*partial*"))


def test_a_projection_of_parts_of_two_types_is_their_products_side_by_side_plus_the_bias() -> None:
    """What a fused layer's q, k, v (Q4_K and Q6_K in one file) computes: each part's own product, bit for
    bit, the rows rounded once for both."""
    k = 512
    q4 = pack_q4k(random_q4k(32, k, seed=1), 32, k)
    q6 = pack_q6k(random_q6k(16, k, seed=2), 16, k)
    parts = [(torch.from_numpy(p.blocks), p.n, p.kind) for p in (q4, q6)]
    bias = torch.randn(48, generator=torch.Generator().manual_seed(4))
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(5))
    y = gguf_mm().Projection(parts, bias)(x)
    expected = torch.cat([kernel_product(x, blocks, n, kind) for blocks, n, kind in parts], dim=1) + bias
    assert torch.equal(y, expected)
    with pytest.raises(RuntimeError, match="bias"):
        gguf_mm().Projection(parts, torch.zeros(3))
    with pytest.raises(RuntimeError, match="Q5_0"):
        gguf_mm().Projection([(parts[0][0], 32, "Q5_0")])


ATTENTION_VARIANTS = ["native"] + (["avx2", "scalar"] if platform.machine() == "x86_64" else [])


@pytest.mark.parametrize("variant", ATTENTION_VARIANTS)
@pytest.mark.parametrize(
    ("n_q", "n_heads", "n_kv", "d", "s", "window"),
    [(1, 12, 2, 128, 100, 0), (5, 14, 2, 64, 300, 0), (3, 4, 4, 32, 50, 7)],
)
def test_row_attention_is_softmax_attention_and_a_row_s_output_is_its_own(
    variant: str, n_q: int, n_heads: int, n_kv: int, d: int, s: int, window: int
) -> None:
    """Grouped-query heads (the 1.5B's 12 over 2, the 0.5B's 14 over 2), a sliding window: within float
    rounding of a float64 softmax, and each query row alone gives its output bit for bit."""
    g = torch.Generator().manual_seed(n_q)
    q = torch.randn(n_q, n_heads, d, generator=g)
    k, v = torch.randn(n_kv, s, d, generator=g) * 2, torch.randn(n_kv, s, d, generator=g)
    positions = torch.arange(s - n_q, s)
    out = gguf_mm(variant).row_attention(q, k, v, positions, window)
    for t in range(n_q):
        last = int(positions[t])
        first = max(0, last - window + 1) if window > 0 else 0
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)
            weights = (k[kv, first : last + 1].double() @ q[t, h].double() / d**0.5).softmax(0)
            expected = weights @ v[kv, first : last + 1].double()
            torch.testing.assert_close(out[t, h].double(), expected, rtol=0, atol=1e-5)
    alone = torch.cat(
        [gguf_mm(variant).row_attention(q[i : i + 1], k, v, positions[i : i + 1], window) for i in range(n_q)]
    )
    assert torch.equal(alone, out)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the AVX2 build is x86-64 code")
def test_the_environment_picks_an_older_cpus_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """VOICEAGENT_CPU_KERNELS=avx2 runs the AVX2-only CPU's build on this one (to time its code paths);
    a name that is no build is refused with the names that are."""

    def with_environment(value: str | None) -> None:  # the variable is read once a process: read it again
        if value is None:
            monkeypatch.delenv("VOICEAGENT_CPU_KERNELS")
        else:
            monkeypatch.setenv("VOICEAGENT_CPU_KERNELS", value)
        _variant_from_environment.cache_clear()

    with_environment("avx2")
    assert gguf_mm().isa() == "avx2"
    with_environment("avx3")
    with pytest.raises(ValueError, match="native, avx2, scalar"):
        gguf_mm()
    with_environment(None)
    assert gguf_mm().isa() == gguf_mm("native").isa()


def test_a_kernel_call_lets_other_threads_run_python() -> None:
    """A product lets go of Python's lock while it computes: a voice session's event loop and recogniser
    run beside the engine's forwards instead of waiting for each call to return."""
    n, k, rows = 2048, 4096, 64  # ~0.1-0.3 s on the scalar path of 2 cores
    packed = pack_q4k(random_q4k(n, k, seed=5), n, k)
    blocks = torch.from_numpy(packed.blocks)
    rounded = quantized(
        gguf_mm(), torch.randn(rows, k, generator=torch.Generator().manual_seed(5)), GGMLQuantizationType.Q4_K
    )
    started = time.perf_counter()
    product(gguf_mm(), rounded, blocks, n, GGMLQuantizationType.Q4_K, simd=False)  # the scalar path: slow
    call_s = time.perf_counter() - started
    worker = threading.Thread(
        target=product, args=(gguf_mm(), rounded, blocks, n, GGMLQuantizationType.Q4_K, False)
    )
    gaps, last = [], time.perf_counter()
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    worker.join()
    assert call_s > 0.05, f"the call took {call_s:.3f} s: too short to tell"
    assert max(gaps) < 0.5 * call_s, (max(gaps), call_s)
