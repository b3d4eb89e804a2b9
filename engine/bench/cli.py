"""`python -m engine bench`: plain vs speculative decoding, interleaved per prompt in one process.

For each prompt: the engine's plain and speculative decoding (and other weight formats with --also), and
with `--compare hf` transformers' `generate` plain and assisted on the same checkpoints, dtype and threads.
Greedy, so all must produce the same tokens; a mismatch is reported with where it starts (in bf16 a
near-tie can flip between two computation orders). tok/s is end to end: new tokens / wall time of the
call, prefill included, for every contender alike. Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.bench.contenders import (
    EngineContender,
    HFContender,
    Result,
    load_hf_pair,
    plain_decode_s_per_token,
    raw_forward_s,
)
from engine.bench.shapes import run_shapes
from engine.cli_flags import add_speculation_flags, gamma_arg
from engine.engine_thread import on_engine_thread
from engine.generate import Engine
from engine.load import chat_prompt, load_engine
from engine.models import resolve
from engine.options import DEFAULT_OPTIONS, DTYPES, EngineOptions
from engine.quant import QUANT_MODES, QuantMode

LLAMA_CPP_PLAIN_TOK_S = 38.0  # llama.cpp, same pair as Q4_K_M, 2 threads, 128 tokens (issue 3's measurement)


def add_bench_parser(commands: Any) -> None:
    bench = commands.add_parser("bench", help="time plain vs speculative decoding on a prompt set")
    bench.add_argument("--target", default=DEFAULT_OPTIONS.target)
    bench.add_argument("--draft", default=DEFAULT_OPTIONS.draft)
    bench.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    bench.add_argument("--max-new-tokens", type=int, default=96)
    add_speculation_flags(bench)
    bench.add_argument(
        "--dtype", choices=[*DTYPES, "fp8"], default="bf16", help="fp8: fp8 weights (with --shapes on a GPU)"
    )
    bench.add_argument("--compare", choices=["hf"], default=None, help="also time transformers' generate")
    bench.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="QUANT:DRAFT_QUANT:GAMMA",
        help="another engine configuration to time, e.g. int4:int4:auto (repeatable)",
    )
    bench.add_argument("--limit", type=int, default=None, help="use the first N prompts only")
    shapes = bench.add_argument_group("random weights with real shapes (GPU timing)")
    shapes.add_argument("--shapes", default=None, metavar="TARGET:DRAFT", help="e.g. llama3-70b:llama3-8b")
    shapes.add_argument("--random-weights", action="store_true", help="required with --shapes")
    shapes.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    shapes.add_argument("--context", type=int, default=1024, help="tokens already in the cache")
    shapes.add_argument("--max-gamma", type=int, default=8)
    shapes.add_argument("--repeats", type=int, default=20)
    bench.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    bench.set_defaults(run=run_bench)


def read_prompts(path: Path) -> list[str]:
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            record = json.loads(line)
            if not isinstance(record.get("prompt"), str):
                raise ValueError(f"{path}:{number}: each line needs a string field 'prompt'")
            prompts.append(record["prompt"])
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


@dataclass(frozen=True)
class EngineConfig:
    quant: QuantMode
    draft_quant: QuantMode
    gamma: int | str

    @classmethod
    def parse(cls, text: str) -> EngineConfig:
        parts = text.split(":")
        if len(parts) != 3 or parts[0] not in QUANT_MODES or parts[1] not in QUANT_MODES:
            raise ValueError(f"--also {text!r}: expected QUANT:DRAFT_QUANT:GAMMA, e.g. int4:int4:auto")
        return cls(parts[0], parts[1], gamma_arg(parts[2]))  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        return f"target {self.quant}, draft {self.draft_quant}, gamma {self.gamma}"


@dataclass
class Pair:
    """An engine configuration timed as plain and speculative decoding (same target weights)."""

    config: EngineConfig
    plain: EngineContender
    spec: EngineContender


def build_pairs(args: argparse.Namespace) -> list[Pair]:
    configs = [EngineConfig(args.quant, args.draft_quant, args.gamma)]
    configs += [EngineConfig.parse(text) for text in args.also]
    pairs: list[Pair] = []
    engines: dict[tuple[str, str], Engine] = {}
    for config in configs:
        key = (config.quant, config.draft_quant)
        if key not in engines:
            options = EngineOptions(
                args.target, args.draft, dtype=args.dtype, quant=config.quant, draft_quant=config.draft_quant
            )
            engines[key] = load_engine(options)
        engine = engines[key]
        suffix = "" if not pairs else f"#{len(pairs) + 1}"
        pairs.append(
            Pair(
                config,
                EngineContender(f"plain{suffix}", engine, 0),
                EngineContender(f"spec{suffix}", engine, config.gamma),
            )
        )
    return pairs


def hf_contenders(args: argparse.Namespace, engine: Engine) -> list[HFContender]:
    target, draft = load_hf_pair(resolve(args.target), resolve(args.draft), DTYPES[args.dtype])
    eos = sorted(engine.eos_ids)
    return [HFContender("hf plain", target, eos), HFContender("hf assisted", target, eos, assistant=draft)]


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def run_bench(args: argparse.Namespace) -> int:
    if args.shapes is not None:
        return run_shapes_bench(args)
    if args.dtype == "fp8":
        raise ValueError("--dtype fp8 is for --shapes ... --random-weights on a GPU with fp8 support")
    prompts = read_prompts(args.prompts)[: args.limit]
    pairs = build_pairs(args)
    main = pairs[0]
    hf = hf_contenders(args, main.plain.engine) if args.compare == "hf" else []
    contenders: list[EngineContender | HFContender] = [c for p in pairs for c in (p.plain, p.spec)] + hf
    tokenizer = main.plain.engine.tokenizer
    warm_up = chat_prompt(tokenizer, [{"role": "user", "content": "Hi"}])
    for contender in contenders:
        contender.run(warm_up, 4)
    for number, pair in enumerate(pairs, start=1):
        print(f"config #{number}: {pair.config.label}{' (main)' if number == 1 else ''}")
    print(" #  " + "  ".join(f"{c.name:>12}" for c in contenders) + "  accept  tok/verify  match")
    rows = []
    for index, text in enumerate(prompts):
        prompt = chat_prompt(tokenizer, [{"role": "user", "content": text}])
        results = {c.name: c.run(prompt, args.max_new_tokens) for c in contenders}
        row = prompt_row(text, results, pairs, hf)
        rows.append(row)
        rates = "  ".join(f"{results[c.name].tok_s:>12.2f}" for c in contenders)
        print(
            f"{index:>2}  {rates}  {row['acceptance_rate']:>6.2f}  {row['mean_accepted_len']:>10.2f}  "
            f"{'yes' if row['greedy_match'] else 'NO: ' + ', '.join(row['mismatch'])}",
            flush=True,
        )
    summary = summarise(args, rows, pairs, contenders, prompts)
    print(f"plain-decoding overhead over raw target forwards: {summary['plain_overhead_pct']:.1f}%")
    print(
        f"best: {summary['best_tok_s']:.2f} tok/s ({summary['best_config']}); llama.cpp plain "
        f"{LLAMA_CPP_PLAIN_TOK_S:.0f} tok/s on the same pair (Q4_K_M)"
    )
    print(json.dumps(summary))
    return 0


def run_shapes_bench(args: argparse.Namespace) -> int:
    if not args.random_weights:
        raise ValueError("--shapes times random weights: add --random-weights")
    weights: QuantMode = "fp8" if args.dtype == "fp8" else "none"
    if args.dtype not in ("bf16", "fp8"):
        raise ValueError("--shapes runs bf16 or fp8 weights")
    result = run_shapes(
        args.shapes,
        weights,
        args.device,
        args.max_gamma,
        args.context,
        args.repeats,
        log=lambda message: print(message, flush=True),
    )
    print(f"{'acceptance':>10} {'best gamma':>10} {'ms/token':>9} {'plain ms/token':>14} {'speedup':>7}")
    for row in result["projection"]:
        print(
            f"{row['acceptance']:>10.2f} {row['best_gamma']:>10} {row['ms_per_token']:>9.2f} "
            f"{row['plain_ms_per_token']:>14.2f} {row['speedup']:>7.2f}"
        )
    print(json.dumps(result))
    return 0


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def prompt_row(
    text: str, results: dict[str, Result], pairs: list[Pair], hf: list[HFContender]
) -> dict[str, Any]:
    main = pairs[0]
    reference = results[main.plain.name].token_ids
    # Each speculative run must equal its own plain run; transformers must equal the engine's plain run.
    checks = [(p.spec.name, results[p.plain.name].token_ids) for p in pairs]
    checks += [(c.name, reference) for c in hf]
    mismatch = {name: first_divergence(results[name].token_ids, ref) for name, ref in checks}
    mismatch = {name: at for name, at in mismatch.items() if at is not None}
    spec = results[main.spec.name]
    row: dict[str, Any] = {
        "prompt": text[:60],
        "ar_tok_s": results[main.plain.name].tok_s,
        "spec_tok_s": spec.tok_s,
        "hf_ar_tok_s": results["hf plain"].tok_s if hf else None,
        "hf_assisted_tok_s": results["hf assisted"].tok_s if hf else None,
        "acceptance_rate": spec.acceptance_rate or 0.0,
        "mean_accepted_len": spec.mean_accepted_len or 1.0,
        "greedy_match": not mismatch,
        "mismatch": [f"{name} at token {at}" for name, at in mismatch.items()],
        "n_tokens": len(reference),
        "tok_s": {name: result.tok_s for name, result in results.items()},
    }
    return row


def summarise(
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    pairs: list[Pair],
    contenders: list[EngineContender | HFContender],
    prompts: list[str],
) -> dict[str, Any]:
    def mean_of(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return statistics.mean(values) if values else None

    mean_tok_s = {c.name: statistics.mean(r["tok_s"][c.name] for r in rows) for c in contenders}
    engine_names = {c.name: p.config for p in pairs for c in (p.plain, p.spec)}
    best_name = max(engine_names, key=lambda name: mean_tok_s[name])
    best = engine_names[best_name]
    main = pairs[0].plain.engine
    prompt = chat_prompt(main.tokenizer, [{"role": "user", "content": prompts[0]}])
    raw_s = raw_forward_s(main, len(prompt) + 32)
    plain_s = plain_decode_s_per_token(main, prompt, 32)
    ar, spec, hf_assisted = mean_of("ar_tok_s"), mean_of("spec_tok_s"), mean_of("hf_assisted_tok_s")
    assert ar is not None and spec is not None
    return {
        "target": args.target,
        "draft": args.draft,
        "dtype": args.dtype,
        "gamma": args.gamma,
        "quant": args.quant,
        "draft_quant": args.draft_quant,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "n_prompts": len(rows),
        "ar_tok_s": ar,
        "spec_tok_s": spec,
        "hf_ar_tok_s": mean_of("hf_ar_tok_s"),
        "hf_assisted_tok_s": hf_assisted,
        "speedup": spec / ar,
        "speedup_vs_hf_assisted": spec / hf_assisted if hf_assisted else None,
        "acceptance_rate": mean_of("acceptance_rate"),
        "mean_accepted_len": mean_of("mean_accepted_len"),
        "greedy_match": all(r["greedy_match"] for r in rows),
        "best_tok_s": mean_tok_s[best_name],
        "best_config": f"{'plain' if best_name.startswith('plain') else 'speculative'}, {best.label}",
        "llama_cpp_plain_tok_s": LLAMA_CPP_PLAIN_TOK_S,
        "raw_forward_ms": 1000 * raw_s,
        "plain_ms_per_token": 1000 * plain_s,
        "plain_overhead_pct": 100 * (plain_s / raw_s - 1),
        "tok_s": mean_tok_s,
        "rows": rows,
    }
