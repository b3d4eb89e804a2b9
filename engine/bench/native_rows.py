"""What a forward of n ids costs on the engine's own CPU kernel, beside llama.cpp's, in one run.

    python -m engine.bench.native_rows [--repeat 5]

Two tables. The kernel alone (engine/cpu_kernels/gguf_mm.cpp): the target's two largest matrix shapes
(gate+up, Q4_K, 17920 x 1536; down, Q6_K, 1536 x 8960) with random blocks, 8 copies so that every call
streams its weights from memory, timed for 1..64 rows: where the time stays flat the kernel is bound by
reading weights, and GB/s says how close to the machine's bandwidth it is. Then the whole target: a forward
of n ids after 300 cached positions on the native backend and on the ggml backend, interleaved, the median
of `--repeat`. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from engine.bench.cpu_backends import cpu_description
from engine.bundled import DEFAULT_TARGET
from engine.config import ModelArgs
from engine.cpu_kernels import gguf_mm
from engine.cpu_kernels.pack import PackedMatrix, pack_q4k, pack_q6k
from engine.engine_thread import on_engine_thread
from engine.ggml import GgmlModel
from engine.gguf_int4 import load_gguf_int4
from engine.models import resolve, resolve_gguf
from engine.q4k import Q4K_BLOCK_BYTES, SUPER_BLOCK

KERNEL_ROWS = (1, 2, 3, 4, 5, 8, 9, 16, 32, 64)
MODEL_IDS = (1, 2, 3, 5, 9, 16, 32, 64)
CACHED = 300
COPIES = 8  # 8 x 16-28 MB: more than any L3 here


def random_blocks(n: int, k: int, q6: bool) -> PackedMatrix:
    rng = np.random.default_rng(0)
    block_bytes = 210 if q6 else Q4K_BLOCK_BYTES
    raw = rng.integers(0, 256, size=(n * k // SUPER_BLOCK, block_bytes), dtype=np.uint8)
    scale_at = slice(208, 210) if q6 else slice(0, 4)
    raw[:, scale_at] = (
        rng.uniform(1e-4, 1e-3, size=(raw.shape[0], 1 if q6 else 2)).astype(np.float16).view(np.uint8)
    )
    return (pack_q6k if q6 else pack_q4k)(raw.reshape(n, -1), n, k)


def median_ms(run: Callable[[], object], repeat: int) -> float:
    run()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def kernel_table(repeat: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, n, k, q6 in (("gate+up Q4_K", 17920, 1536, False), ("down Q6_K", 1536, 8960, True)):
        packed = random_blocks(n, k, q6)
        copies = [torch.from_numpy(packed.blocks.copy()) for _ in range(COPIES)]
        for m in KERNEL_ROWS:
            xq, xs, xsum = gguf_mm().quantize_rows(torch.randn(m, k))

            def call(xq=xq, xs=xs, xsum=xsum, copies=copies, n=n, q6=q6) -> None:
                for blocks in copies:
                    gguf_mm().matmul(xq, xs, xsum, blocks, n, q6, True)

            ms = median_ms(call, repeat) / COPIES
            gbs = packed.blocks.nbytes / ms / 1e6
            rows.append({"matrix": name, "rows": m, "ms": round(ms, 3), "GB_s": round(gbs, 1)})
            print(f"{name} {m:3} rows: {ms:6.3f} ms  {gbs:5.1f} GB/s", file=sys.stderr)
    return rows


def model_table(repeat: int) -> list[dict[str, object]]:
    path = resolve_gguf(DEFAULT_TARGET)
    args = ModelArgs.from_json(resolve(DEFAULT_TARGET) / "config.json")
    native = load_gguf_int4(path, args, max_seq_len=1024, dtype=torch.float32, quant="gguf-a8")
    cache = native.new_cache(1024)
    ggml = GgmlModel(path, 1024)
    ggml_cache = ggml.new_cache(1024)
    prompt = list(range(1000, 1000 + CACHED))
    with torch.inference_mode():
        native(torch.tensor(prompt), torch.arange(CACHED), cache, CACHED, "none")
    ggml_cache.forward(prompt, 0, 1)
    rows: list[dict[str, object]] = []
    for n in MODEL_IDS:
        ids = [2000 + i for i in range(n)]

        def ours(ids: list[int] = ids) -> None:
            with torch.inference_mode():
                native(
                    torch.tensor(ids),
                    torch.arange(CACHED, CACHED + len(ids)),
                    cache,
                    CACHED + len(ids),
                    len(ids),
                )

        def theirs(ids: list[int] = ids) -> None:
            ggml_cache.forward(ids, CACHED, len(ids))

        ours_ms, theirs_ms = [], []
        for _ in range(repeat):  # interleaved: the same drift for both
            ours_ms.append(median_ms(ours, 1))
            theirs_ms.append(median_ms(theirs, 1))
        a, b = statistics.median(ours_ms), statistics.median(theirs_ms)
        rows.append(
            {"ids": n, "native_ms": round(a, 1), "ggml_ms": round(b, 1), "ggml_over_native": round(b / a, 2)}
        )
        print(f"{n:3} ids: native {a:6.1f} ms, ggml {b:6.1f} ms ({b / a:4.2f}x)", file=sys.stderr)
    return rows


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"kernel build: {gguf_mm().isa()}", file=sys.stderr)
    summary = {
        **cpu_description(),
        "isa": gguf_mm().isa(),
        "kernel": kernel_table(args.repeat),
        "forwards_after_300": model_table(args.repeat),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
