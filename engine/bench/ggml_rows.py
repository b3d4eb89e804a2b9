"""What a forward of n ids costs on llama.cpp's kernels (the ggml backend): is prefill compute-bound here?

    python -m engine.bench.ggml_rows [--target qwen2.5-coder-1.5b-instruct] [--repeat 4]

For n in 1..32 ids after 300 cached positions, the median time of `--repeat` forwards, with the logits of
the last id only (a prefill) and of every id (a verify). Where the time per id stays flat as n grows, the
forward is bound by arithmetic, not by reading the weights: a voice turn's prefill of its last few ids then
costs about n times an id, however they are batched. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from engine.bench.cpu_backends import cpu_description
from engine.bundled import DEFAULT_TARGET
from engine.engine_thread import on_engine_thread
from engine.ggml import GgmlCache, GgmlModel
from engine.models import resolve_gguf

SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32)
CACHED = 300  # positions already in the cache, as after a short conversation


def forward_ms(cache: GgmlCache, n: int, n_logits: int, repeat: int) -> float:
    """Median ms of `repeat` forwards of n ids at position CACHED (each drops the cells of the one before)."""
    times = []
    for r in range(repeat):
        ids = [2000 + 40 * r + i for i in range(n)]
        started = time.perf_counter()
        cache.forward(ids, CACHED, n_logits)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=DEFAULT_TARGET, help="a bundled name or a .gguf file")
    parser.add_argument("--repeat", type=int, default=4)
    args = parser.parse_args()
    model = GgmlModel(resolve_gguf(args.target), 2 * CACHED)
    cache = model.new_cache(2 * CACHED)
    cache.forward(list(range(1000, 1000 + CACHED)), 0, 1)  # the cached positions, prefilled once
    rows = []
    for n in SIZES:
        last, every = forward_ms(cache, n, 1, args.repeat), forward_ms(cache, n, n, args.repeat)
        rows.append({"ids": n, "prefill_ms": round(last, 1), "verify_ms": round(every, 1)})
        print(
            f"{n:3} ids: prefill {last:6.0f} ms ({last / n:5.1f} an id), verify {every:6.0f} ms",
            file=sys.stderr,
        )
    print(json.dumps({"target": args.target, **cpu_description(), "forwards": rows}))


if __name__ == "__main__":
    main()
