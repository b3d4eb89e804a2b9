"""`python -m engine bench`: plain vs speculative decoding on the same target, interleaved in one process.

Greedy, so both must produce the same tokens (a mismatch is reported, with bf16's near-ties in mind).
Prints a table, then one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from engine.generate import Engine
from engine.load import DTYPES, chat_prompt, load_engine
from engine.metrics import EngineMetrics, GenerationStats
from engine.sampling import SamplingParams


@dataclass(frozen=True)
class Run:
    token_ids: list[int]
    stats: GenerationStats


def add_bench_parser(commands: Any) -> None:
    bench = commands.add_parser("bench", help="time plain vs speculative decoding on a prompt set")
    bench.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    bench.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    bench.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    bench.add_argument("--max-new-tokens", type=int, default=96)
    bench.add_argument("--gamma", type=int, default=4)
    bench.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    bench.add_argument("--limit", type=int, default=None, help="use the first N prompts only")
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


def timed(engine: Engine, prompt: list[int], gamma: int, max_new_tokens: int) -> Run:
    params = SamplingParams(max_new_tokens=max_new_tokens)
    token_ids: list[int] = []
    stats = None
    for block in engine.new_conversation().generate(prompt, params, gamma=gamma):
        token_ids.extend(block.token_ids)
        stats = block.stats or stats
    assert stats is not None
    return Run(token_ids, stats)


@dataclass(frozen=True)
class PromptRow:
    prompt: str
    ar_tok_s: float
    spec_tok_s: float
    speedup: float
    acceptance_rate: float
    mean_accepted_len: float
    greedy_match: bool
    n_tokens: int

    @classmethod
    def compare(cls, text: str, plain: Run, spec: Run) -> PromptRow:
        return cls(
            prompt=text[:60],
            ar_tok_s=plain.stats.tokens_per_s,
            spec_tok_s=spec.stats.tokens_per_s,
            speedup=spec.stats.tokens_per_s / plain.stats.tokens_per_s,
            acceptance_rate=spec.stats.acceptance_rate,
            mean_accepted_len=spec.stats.mean_accepted_len,
            greedy_match=spec.token_ids == plain.token_ids,
            n_tokens=len(plain.token_ids),
        )


HEADER = " #  plain tok/s  spec tok/s  speedup  accept  tok/verify  match"


def run_bench(args: argparse.Namespace) -> int:
    prompts = read_prompts(args.prompts)[: args.limit]
    engine = load_engine(args.target, args.draft, dtype=args.dtype, gamma=args.gamma)
    warm_up = chat_prompt(engine.tokenizer, [{"role": "user", "content": "Hi"}])
    timed(engine, warm_up, args.gamma, 4)
    engine.metrics = EngineMetrics()
    rows: list[PromptRow] = []
    print(HEADER)
    for index, text in enumerate(prompts):
        prompt = chat_prompt(engine.tokenizer, [{"role": "user", "content": text}])
        plain = timed(engine, prompt, 0, args.max_new_tokens)
        spec = timed(engine, prompt, args.gamma, args.max_new_tokens)
        row = PromptRow.compare(text, plain, spec)
        rows.append(row)
        print(
            f"{index:>2} {row.ar_tok_s:>12.2f} {row.spec_tok_s:>11.2f} {row.speedup:>8.2f} "
            f"{row.acceptance_rate:>7.2f} {row.mean_accepted_len:>11.2f}  {row.greedy_match}",
            flush=True,
        )
    ar_tok_s = statistics.mean(r.ar_tok_s for r in rows)
    spec_tok_s = statistics.mean(r.spec_tok_s for r in rows)
    summary = {
        "target": args.target,
        "draft": args.draft,
        "dtype": args.dtype,
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "ar_tok_s": ar_tok_s,
        "spec_tok_s": spec_tok_s,
        "speedup": spec_tok_s / ar_tok_s,
        "acceptance_rate": engine.metrics.acceptance_rate,
        "mean_accepted_len": engine.metrics.mean_accepted_len,
        "greedy_match": all(r.greedy_match for r in rows),
        "rows": [asdict(r) for r in rows],
    }
    print(json.dumps(summary))
    return 0
