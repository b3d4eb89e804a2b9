"""Can a PyTorch path give this CPU a verify that costs about one step? Kernels by number of rows, then the
bundled target's forwards on W8A8 (`torch._int_mm`) beside the ggml backend, in one run.

    python -m engine.bench.w8a8 [--prompts 8] [--skip-kernels]

1. One 1536x8960 matrix (the target's down projection), 24 distinct copies so that the weights stream from
   memory rather than the cache, per rows M: int8 x int8 `torch._int_mm` (oneDNN: AMX or VNNI), the int4
   weight-only kernel the torch int4 path uses, and bf16 `F.linear`.
2. The bundled target's forward of n ids after 200 cached (engine.bench.cpu_backends.forward_costs) on the
   ggml backend and as W8A8, alternating, twice.
3. How often W8A8's greedy next token is bf16's, teacher-forced along the ggml target's greedy replies to
   the first bench prompts (W8A8 is a re-quantisation of the bf16 weights, not the GGUF's).

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.bench.cpu_backends import cpu_description, engine_generate, forward_costs
from engine.bench.int4_profile import fastest_ms
from engine.bundled import DEFAULT_TARGET
from engine.engine_thread import on_engine_thread
from engine.generate import Engine, ModelState
from engine.load import chat_prompt, load_engine

N, K = 8960, 1536  # Qwen2.5-1.5B's w2: [out, in] as the kernels take it
COPIES = 24  # 24 x 13.8 MB int8 is past a 105 MB L3
ROWS = (1, 5, 16, 32)


def per_matrix_ms(run: Callable[[], object], repeats: int = 3) -> float:
    return fastest_ms(run, repeats) / COPIES


def int_mm_all(x: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch._int_mm(x, w.t()) for w in weights]  # w: [N, K] int8, taken as its [K, N] view


def int4_mm_all(x: torch.Tensor, weights: list[torch.Tensor], scales: torch.Tensor) -> list[torch.Tensor]:
    return [torch.ops.aten._weight_int4pack_mm_for_cpu(x, w, 32, scales) for w in weights]


def bf16_mm_all(x: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    return [F.linear(x, w) for w in weights]


def kernel_table() -> dict[str, dict[int, float]]:
    int8 = [torch.randint(-127, 128, (N, K), dtype=torch.int8) for _ in range(COPIES)]
    int4 = [
        torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (N, K), dtype=torch.int32), 2)
        for _ in range(COPIES)
    ]
    int4_scales = torch.rand(K // 32, N, 2).to(torch.bfloat16)
    bf16 = [torch.randn(N, K).to(torch.bfloat16) for _ in range(COPIES)]
    table: dict[str, dict[int, float]] = {"w8a8 _int_mm": {}, "int4 weight-only": {}, "bf16 linear": {}}
    for m in ROWS:
        x8 = torch.randint(-127, 128, (m, K), dtype=torch.int8)
        x16 = torch.randn(m, K).to(torch.bfloat16)
        table["w8a8 _int_mm"][m] = per_matrix_ms(functools.partial(int_mm_all, x8, int8))
        table["int4 weight-only"][m] = per_matrix_ms(functools.partial(int4_mm_all, x16, int4, int4_scales))
        table["bf16 linear"][m] = per_matrix_ms(functools.partial(bf16_mm_all, x16, bf16))
        print(f"M={m}", {name: round(row[m], 2) for name, row in table.items()}, "ms a matrix", flush=True)
    return table


def greedy_along(engine: Engine, ids: list[int]) -> list[int]:
    """The target's argmax at every position of `ids` (one forward, all logits)."""
    model = engine.target
    state = ModelState(model, model.new_cache(len(ids) + 8))
    with torch.inference_mode():
        logits = state.feed(ids, 0, "all")  # [len(ids), vocab]
    assert logits is not None
    return logits.argmax(-1).tolist()


def agreement(reference: Engine, bf16: Engine, w8a8: Engine, prompts: list[str]) -> dict[str, float]:
    same = total = 0
    for text in prompts:
        prompt = chat_prompt(reference.tokenizer, [{"role": "user", "content": text}])
        reply = engine_generate(reference, prompt, 32, 0)[0].token_ids
        ids = prompt + reply
        start = len(prompt) - 1  # the positions that predict the reply's tokens
        a, b = greedy_along(bf16, ids)[start:], greedy_along(w8a8, ids)[start:]
        same += sum(x == y for x, y in zip(a, b, strict=True))
        total += len(a)
        print(f"agreement so far {same}/{total}", flush=True)
    return {"positions": total, "w8a8_top1_equals_bf16": same / max(total, 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {"machine": cpu_description()}
    if not args.skip_kernels:
        summary["kernels_ms_a_matrix"] = kernel_table()
    started = time.perf_counter()
    w8a8 = load_engine(args.target, None, quant="w8a8", max_seq_len=1024)
    summary["w8a8_load_s"] = time.perf_counter() - started
    ggml = load_engine(args.target, None, backend="ggml", max_seq_len=1024)
    for round_ in range(2):
        for name, engine in (("ggml", ggml), ("w8a8", w8a8)):
            costs = forward_costs(engine)
            summary.setdefault(f"{name}_forward", []).append(costs)
            print(f"round {round_} {name}", {k: round(v, 1) for k, v in costs.items()}, flush=True)
    if args.prompts:
        bf16 = load_engine(args.target, None, max_seq_len=1024)
        lines = Path("bench/prompts.jsonl").read_text().splitlines()
        texts = [json.loads(line)["prompt"] for line in lines if line.strip()][: args.prompts]
        summary["agreement"] = agreement(ggml, bf16, w8a8, texts)
    summary["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return summary


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--prompts", type=int, default=8, help="bench prompts for the agreement (0: none)")
    parser.add_argument("--skip-kernels", action="store_true")
    print(json.dumps(run(parser.parse_args())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
