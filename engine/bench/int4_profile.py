"""Where the PyTorch int4 path's time goes on this CPU: the packed kernel alone on the bundled target's
shapes, then a torch-profiler table of a one-id forward of the real int4 target.

    python -m engine.bench.int4_profile [--target qwen2.5-coder-1.5b-instruct]

The last line is one JSON object (ms by shape and rows; the forward's time; the kernel's share).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from engine.bench.cpu_backends import cpu_description
from engine.bundled import DEFAULT_TARGET
from engine.engine_thread import on_engine_thread
from engine.models import converted_dir
from engine.quant import quantize
from engine.weights import load_checkpoint

# (out_features N, in_features K) of Qwen2.5-1.5B's fused projections and its head
SHAPES = {"wqkv": (2048, 1536), "wo": (1536, 1536), "w13": (17920, 1536), "w2": (1536, 8960)}
HEAD = (151936, 1536)
KERNEL = "aten::_weight_int4pack_mm_for_cpu"


def fastest_ms(run: Callable[[], object], repeats: int = 10) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def int4_mm(x: torch.Tensor, packed: torch.Tensor, group: int, scales: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales)


def kernel_table(group: int = 128) -> dict[str, dict[str, float]]:
    table = {}
    for name, (n, k) in {**SHAPES, "head": HEAD}.items():
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.randint(0, 16, (n, k), dtype=torch.int32), 2
        )
        scales = torch.rand(k // group, n, 2).to(torch.bfloat16)
        row = {}
        for m in (1, 5, 16):
            x = torch.randn(m, k).to(torch.bfloat16)
            row[f"m{m}_ms"] = fastest_ms(functools.partial(int4_mm, x, packed, group, scales))
        row["gb_s_at_m1"] = n * k / 2 / (row["m1_ms"] / 1e3) / 1e9
        table[name] = row
        print(name, {key: round(value, 3) for key, value in row.items()}, flush=True)
    return table


def forward_profile(target: str) -> dict[str, float]:
    model = quantize(load_checkpoint(converted_dir(target), max_seq_len=512, dtype=torch.bfloat16), "int4")
    cache, ids = model.new_cache(), torch.arange(1000, 1200)
    with torch.inference_mode():
        model(ids[:100], torch.arange(100), cache, 100, "none")

        def forward(n: int) -> object:
            return model(ids[100 : 100 + n], torch.arange(100, 100 + n), cache, 100 + n, "all")

        result = {f"forward_{n}_ms": fastest_ms(functools.partial(forward, n), 4) for n in (1, 5)}
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                forward(1)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    kernel = next(e for e in events if e.key == KERNEL)
    result["kernel_share"] = kernel.self_cpu_time_total / total
    result["kernel_calls_per_forward"] = kernel.count / 3
    return result


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default=DEFAULT_TARGET)
    args = parser.parse_args()
    summary = {
        "machine": cpu_description(),
        "kernel": kernel_table(),
        "forward": forward_profile(args.target),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
