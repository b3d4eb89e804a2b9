"""How close each 4-bit target is to the bf16 target and to llama.cpp: next-token agreement and step cost.

    python -m engine.bench.gguf_int4 [--limit 8] [--max-new-tokens 32]

Targets (the bundled 1.5B, plain decoding): `gguf-int4` (the GGUF's own Q4_K weights as torch int4),
`int4` (today's: the bf16 weights re-quantised to int4 in groups of 128), `bf16`, `llama.cpp` (the
same GGUF on the ggml backend) and `native` (its Q4_K / Q6_K blocks on the engine's own kernel, int8
activations: backend native). References: the greedy output of the bf16 target and of llama.cpp, one per
bench prompt (bench/prompts.jsonl). Agreement: each target is fed prompt + reference in one forward and
its top-1 at every generated position is compared with the reference's token (teacher-forced top-1
agreement over the generated tokens; a target against its own reference measures the rounding between
one forward and one-id steps). Forward cost: one id after CONTEXT cached ids, median of 5 after a
warm-up. Models are loaded one at a time. Also (--weights-only: just this) the RMS error, relative to the
GGUF's own weights, of the weights each form multiplies by on three Q4_K tensors. The last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine.bench.cpu_backends import cpu_description
from engine.bundled import DEFAULT_TARGET
from engine.engine_thread import on_engine_thread
from engine.generate import Engine
from engine.gguf_int4 import GgufTensors
from engine.load import chat_prompt, load_engine
from engine.models import resolve_gguf
from engine.quant import Int4Linear
from engine.sampling import SamplingParams

PROMPTS = Path(__file__).resolve().parents[2] / "bench" / "prompts.jsonl"
CONTEXT = 64  # ids cached before a one-id forward is timed
WEIGHT_SAMPLES = ("blk.0.attn_q.weight", "blk.10.ffn_gate.weight", "blk.20.attn_output.weight")
TARGETS: dict[str, dict[str, str]] = {  # name -> load_engine settings
    "llama.cpp": {"backend": "ggml"},
    "bf16": {"quant": "none"},
    "int4": {"quant": "int4"},
    "gguf-int4": {"quant": "gguf-int4"},
    "native": {"backend": "native"},  # gguf-a8: the file's Q4_K / Q6_K blocks on the engine's kernel
}


def bench_prompts(engine: Engine, limit: int) -> list[list[int]]:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()][:limit]
    return [chat_prompt(engine.tokenizer, [{"role": "user", "content": row["prompt"]}]) for row in rows]


def greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    blocks = engine.new_conversation().generate(prompt, SamplingParams(max_new_tokens=n), gamma=0)
    return [t for block in blocks for t in block.token_ids]


def top1_matches(engine: Engine, prompt: list[int], reference: list[int]) -> list[bool]:
    """Per generated position: does the target's top-1 after prompt + reference[:i] equal reference[i]?"""
    model = engine.target
    ids = [*prompt, *reference[:-1]]
    cache = model.new_cache(len(ids) + 1)
    with torch.inference_mode():
        logits = model(torch.tensor(ids), torch.arange(len(ids)), cache, len(ids), len(reference))
    assert logits is not None  # [len(reference), V]
    return [bool(a == b) for a, b in zip(logits.argmax(-1).tolist(), reference, strict=True)]


def one_id_forward_ms(engine: Engine) -> dict[str, float]:
    """A one-id forward after CONTEXT cached ids: median and fastest of 5, after one warm-up."""
    model = engine.target
    cache = model.new_cache(CONTEXT + 8)
    vocab = model.args.vocab_size
    context = [(1000 + 37 * i) % vocab for i in range(CONTEXT)]
    times = []
    with torch.inference_mode():
        model(torch.tensor(context), torch.arange(CONTEXT), cache, CONTEXT, "none")
        for i in range(6):
            started = time.perf_counter()
            model(torch.tensor([context[i]]), torch.tensor([CONTEXT]), cache, CONTEXT + 1, "last")
            times.append((time.perf_counter() - started) * 1e3)
    return {"median_ms": statistics.median(times[1:]), "best_ms": min(times[1:])}


def weight_errors(names: tuple[str, ...] = WEIGHT_SAMPLES) -> dict[str, dict[str, float]]:
    """RMS error of the weights each form multiplies by, over the RMS of the GGUF's own weights: gguf-int4
    with fp32 and bf16 scales/zeros, dense bf16 (the bf16 target), today's int4 (bf16 re-quantised, g128)."""
    tensors = GgufTensors(resolve_gguf(DEFAULT_TARGET))
    errors = {}
    for name in names:
        groups = tensors.q4k(name)
        weight = torch.from_numpy(groups.dequantize()).double()  # [N, K]
        scale = torch.from_numpy(groups.scale).double().repeat_interleave(32, 1)
        zero = 8 * scale - torch.from_numpy(groups.offset).double().repeat_interleave(32, 1)
        q = torch.from_numpy(groups.q).double()

        def held(dtype: torch.dtype, q: Tensor = q, scale: Tensor = scale, zero: Tensor = zero) -> Tensor:
            return (q - 8) * scale.to(dtype).double() + zero.to(dtype).double()

        n, k = weight.shape
        dense = weight.bfloat16().float()
        requantised = Int4Linear(dense, None, torch.bfloat16)
        readout = requantised(torch.eye(k, dtype=torch.bfloat16)).t().double()  # [N, K], rounded to bf16
        rms = weight.pow(2).mean().sqrt()
        forms = {"gguf-int4 fp32": held(torch.float32), "gguf-int4 bf16": held(torch.bfloat16)}
        forms |= {"bf16 dense": dense.double(), "int4 re-quantised (bf16 readout)": readout}
        errors[name] = {form: float((w - weight).pow(2).mean().sqrt() / rms) for form, w in forms.items()}
    return errors


def interleaved_forward_ms(rounds: int) -> dict[str, dict[str, float]]:
    """One-id forward cost of every target, all loaded at once and timed in turn, `rounds` times (on a
    shared machine the load drifts; interleaving gives each target the same drift)."""
    load_s: dict[str, float] = {}
    engines = {name: loaded(name, load_s) for name in TARGETS}
    samples: dict[str, list[float]] = {name: [] for name in TARGETS}
    for _ in range(rounds):
        for name, engine in engines.items():
            samples[name].append(one_id_forward_ms(engine)["median_ms"])
    return {name: {"median_ms": statistics.median(v), "best_ms": min(v)} for name, v in samples.items()}


def machine() -> dict[str, Any]:
    flags = Path("/proc/cpuinfo").read_text()
    description = cpu_description()
    description["avx512"] = "avx512f" in flags
    description["avx2"] = "avx2" in flags
    return description


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def scored(
    engine: Engine, prompts: list[list[int]], references: dict[str, list[list[int]]]
) -> dict[str, Any]:
    """Per reference: top-1 matches over every generated position of every prompt."""
    return {
        name: [m for p, r in zip(prompts, refs, strict=True) for m in top1_matches(engine, p, r)]
        for name, refs in references.items()
    }


def loaded(name: str, load_s: dict[str, float]) -> Engine:
    started = time.perf_counter()
    engine = load_engine(DEFAULT_TARGET, None, max_seq_len=512, **TARGETS[name])  # type: ignore[arg-type]
    load_s[name] = time.perf_counter() - started
    print(f"{name}: loaded in {load_s[name]:.0f} s; {uptime()}", flush=True)
    return engine


def run(limit: int, max_new_tokens: int) -> dict[str, Any]:
    load_s: dict[str, float] = {}
    forward: dict[str, dict[str, float]] = {}
    matches: dict[str, dict[str, list[bool]]] = {}
    llama_cpp = loaded("llama.cpp", load_s)  # kept: its weights are a memory map
    prompts = bench_prompts(llama_cpp, limit)
    references = {"llama.cpp": [greedy(llama_cpp, prompt, max_new_tokens) for prompt in prompts]}
    for name in ("bf16", "int4", "gguf-int4", "native"):  # torch targets, one in memory at a time
        engine = loaded(name, load_s)
        if name == "bf16":
            references["bf16"] = [greedy(engine, prompt, max_new_tokens) for prompt in prompts]
        matches[name] = scored(engine, prompts, references)
        forward[name] = one_id_forward_ms(engine)
        print(f"{name}: one-id forward {forward[name]}; {uptime()}", flush=True)
        del engine
    matches["llama.cpp"] = scored(llama_cpp, prompts, references)
    forward["llama.cpp"] = one_id_forward_ms(llama_cpp)
    same_greedy = sum(a == b for a, b in zip(references["bf16"], references["llama.cpp"], strict=True))
    return {
        "bench": "gguf_int4",
        "target": DEFAULT_TARGET,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "positions": {ref: sum(len(r) for r in refs) for ref, refs in references.items()},
        "top1_agreement": {
            name: {ref: sum(found) / len(found) for ref, found in by_ref.items()}
            for name, by_ref in matches.items()
        },
        "bf16_and_llama_cpp_same_greedy_prompts": same_greedy,
        "one_id_forward_ms": forward,
        "load_s": load_s,
        "machine": machine(),
        "uptime_end": uptime(),
    }


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=8, help="bench prompts to use")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--weights-only", action="store_true", help="only the weight-error table")
    parser.add_argument(
        "--forward-rounds", type=int, default=0, help="only the one-id forward costs, all targets interleaved"
    )
    args = parser.parse_args(argv)
    print(f"start: {uptime()}", flush=True)
    if args.forward_rounds:
        result: dict[str, Any] = {
            "interleaved_one_id_forward_ms": interleaved_forward_ms(args.forward_rounds)
        }
        result |= {"machine": machine(), "uptime_end": uptime()}
    else:
        result = {"weight_rms_error": weight_errors()}
        if not args.weights_only:
            result |= run(args.limit, args.max_new_tokens)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
