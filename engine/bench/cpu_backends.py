"""The engine's CPU backends beside llama.cpp: same GGUF, same prompts, same machine, one run.

    python -m engine.bench.cpu_backends [--limit N] [--max-new-tokens 64] [--torch]

Per prompt, interleaved: llama.cpp's own greedy generation (llama-cpp-python `Llama`), the engine's plain
decoding on the ggml backend, its speculative decoding there (the 0.5B GGUF draft, adaptive length; and
prompt-lookup drafts, no draft model), the same three on the native backend (the target's GGUF blocks on
the engine's own kernel, engine/cpu_kernels; the draft on ggml), and with --torch the PyTorch int4 target
(plain). Then forward costs by number of ids (what a verify costs)
and prefill of 16/32/64 new ids on both. tok/s: generated tokens over the whole call (prefill included);
decode tok/s: tokens after the first over the time after the first. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from engine.adaptive import SpeculationStats
from engine.bench.llama_cpp import LlamaCpp, Timed
from engine.bundled import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.engine_thread import on_engine_thread
from engine.generate import Engine, ModelState
from engine.load import chat_prompt, load_engine
from engine.models import resolve_gguf
from engine.sampling import SamplingParams

SIZES = (1, 2, 3, 5, 9)
PREFILLS = (16, 32, 64)
CONTEXT = 200  # ids cached before timing forwards and prefills
PREFILL_REPEATS = 3  # the median of this many prefills per size (one alone moved by 30% between runs)


def cpu_description() -> dict[str, Any]:
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    return {
        "cpu": model,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }


def engine_generate(engine: Engine, prompt: list[int], n: int, gamma: int | str) -> tuple[Timed, Any]:
    started = time.perf_counter()
    first_at, stats = started, None
    ids: list[int] = []
    for block in engine.new_conversation().generate(prompt, SamplingParams(max_new_tokens=n), gamma=gamma):
        if not ids and block.token_ids:
            first_at = time.perf_counter()
        ids.extend(block.token_ids)
        stats = block.stats or stats
    return Timed(ids, first_at - started, time.perf_counter() - first_at), stats


def probe_figures(speculation: SpeculationStats) -> dict[str, float]:
    """What the adaptive policy's probes cost, beside the blocks' time and the draft's measured costs."""
    return {
        "blocks_s": speculation.run_s,
        "probe_overhead_s": speculation.probe_overhead_s,
        "draft_step_ms": 1e3 * (speculation.draft_step_s() or 0.0),
        "catch_up_ms_an_id": 1e3 * (speculation.catch_up_id_s.value or 0.0),
    }


def forward_costs(engine: Engine) -> dict[str, float]:
    """ms of a target forward of n ids after CONTEXT cached ids (fastest of 3)."""
    model = engine.target
    state = ModelState(model, model.new_cache(CONTEXT + 80))
    vocab = model.args.vocab_size
    ids = [(1000 + 37 * i) % vocab for i in range(CONTEXT + 80)]
    with torch.inference_mode():
        state.feed(ids[:CONTEXT], 0, "none")
        costs = {}
        for n in SIZES:
            best = float("inf")
            for _ in range(3):
                started = time.perf_counter()
                state.feed(ids[CONTEXT : CONTEXT + n], CONTEXT, "all")
                best = min(best, time.perf_counter() - started)
            costs[f"forward_{n}_ms"] = best * 1e3
        for n in PREFILLS:
            seconds = []
            for _ in range(PREFILL_REPEATS):
                started = time.perf_counter()
                state.feed(ids[CONTEXT : CONTEXT + n], CONTEXT, "last")
                seconds.append(time.perf_counter() - started)
            costs[f"prefill_{n}_tok_s"] = n / statistics.median(seconds)
    return costs


def llama_cpp_costs(llm: LlamaCpp, vocab: int) -> dict[str, float]:
    ids = [(1000 + 37 * i) % vocab for i in range(CONTEXT + 80)]
    costs = {}
    for n in PREFILLS:
        new = ids[CONTEXT : CONTEXT + n]
        seconds = [llm.prompt_eval_s(ids[:CONTEXT], new) for _ in range(PREFILL_REPEATS)]
        costs[f"prefill_{n}_tok_s"] = n / statistics.median(seconds)
    return costs


def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    prompts = prompts[: args.limit]
    threads = torch.get_num_threads()
    ggml = load_engine(args.target, args.draft, backend="ggml", gamma="auto", max_seq_len=2048)
    lookup = load_engine(args.target, "ngram", backend="ggml", gamma="auto", max_seq_len=2048)
    native = load_engine(args.target, args.draft, backend="native", gamma="auto", max_seq_len=2048)
    native_lookup = load_engine(args.target, "ngram", backend="native", gamma="auto", max_seq_len=2048)
    llama = LlamaCpp(resolve_gguf(args.target), threads, n_ctx=2048)
    torch_int4 = load_engine(args.target, None, quant="int4", max_seq_len=2048) if args.torch else None
    tokenizer, eos = ggml.tokenizer, sorted(ggml.eos_ids)
    contenders: dict[str, Any] = {
        "llama.cpp": lambda p: (llama.generate(p, args.max_new_tokens, eos), None),
        "ggml plain": lambda p: engine_generate(ggml, p, args.max_new_tokens, 0),
        "ggml spec auto": lambda p: engine_generate(ggml, p, args.max_new_tokens, "auto"),
        "ggml ngram auto": lambda p: engine_generate(lookup, p, args.max_new_tokens, "auto"),
        "native plain": lambda p: engine_generate(native, p, args.max_new_tokens, 0),
        "native spec auto": lambda p: engine_generate(native, p, args.max_new_tokens, "auto"),
        "native ngram auto": lambda p: engine_generate(native_lookup, p, args.max_new_tokens, "auto"),
    }
    if torch_int4 is not None:
        contenders["torch int4 plain"] = lambda p: engine_generate(torch_int4, p, args.max_new_tokens, 0)
    warm = chat_prompt(tokenizer, [{"role": "user", "content": "Hi"}])
    for run_one in contenders.values():
        run_one(warm)
    rows = []
    for item in prompts:
        prompt = chat_prompt(tokenizer, [{"role": "user", "content": item["prompt"]}])
        results = {name: run_one(prompt) for name, run_one in contenders.items()}
        row: dict[str, Any] = {"kind": item.get("kind"), "prompt": item["prompt"][:50]}
        for name, (timed, stats) in results.items():
            row[name] = {"tok_s": timed.tok_s, "decode_tok_s": timed.decode_tok_s, "n": len(timed.token_ids)}
            if stats is not None and stats.n_drafts:
                row[name]["tokens_per_verify"] = stats.mean_accepted_len
                row[name]["drafted_blocks"] = stats.n_drafts
        row["plain_equals_llama_cpp"] = (
            results["ggml plain"][0].token_ids == results["llama.cpp"][0].token_ids
        )
        plain_ids = results["ggml plain"][0].token_ids
        row["spec_equals_plain"] = results["ggml spec auto"][0].token_ids == plain_ids
        row["ngram_equals_plain"] = results["ggml ngram auto"][0].token_ids == plain_ids
        native_ids = results["native plain"][0].token_ids
        row["native_equals_llama_cpp"] = native_ids == results["llama.cpp"][0].token_ids
        row["native_spec_equals_plain"] = results["native spec auto"][0].token_ids == native_ids
        row["native_ngram_equals_plain"] = results["native ngram auto"][0].token_ids == native_ids
        rows.append(row)
        print(
            "  ".join(f"{n}: {row[n]['tok_s']:.2f}" for n in contenders),
            f"[{item['prompt'][:40]}]",
            flush=True,
        )
    summary: dict[str, Any] = {"machine": cpu_description(), "max_new_tokens": args.max_new_tokens}
    for name in contenders:
        summary[name] = {
            key: statistics.mean(r[name][key] for r in rows) for key in ("tok_s", "decode_tok_s")
        }
    base = summary["llama.cpp"]
    for name in contenders:
        summary[name]["vs_llama_cpp"] = summary[name]["tok_s"] / base["tok_s"]
    summary["ggml_forward"] = forward_costs(ggml)
    summary["native_forward"] = forward_costs(native)
    summary["llama_cpp_prefill"] = llama_cpp_costs(llama, ggml.target.args.vocab_size)
    if torch_int4 is not None:
        summary["torch_int4_forward"] = forward_costs(torch_int4)
    summary["calibration_ms"] = {n: 1e3 * (ggml.speculation.verify_s(n) or 0.0) for n in SIZES}
    summary["native_calibration_ms"] = {n: 1e3 * (native.speculation.verify_s(n) or 0.0) for n in SIZES}
    summary["probes"] = probe_figures(ggml.speculation)  # shared by that engine's plain and adaptive runs
    summary["native_probes"] = probe_figures(native.speculation)
    summary["rows"] = rows
    return summary


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--prompts", default="bench/prompts.jsonl")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--torch", action="store_true", help="also the PyTorch int4 target (slow on AVX2)")
    summary = run(parser.parse_args())
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
