"""Does the adaptive speculation pay, and cost nothing where it cannot? The same target four ways, the
order alternating prompt by prompt (ABCD, DCBA) so that a machine's drift falls on all alike.

    python -m bench.spec_vs_plain [--backend native|ggml] [--limit 8] [--rounds 2] [--max-new-tokens 64]

- plain: an engine without a draft model;
- spec auto: an engine with the bundled 0.5B draft and gamma "auto" (the voice agent's default);
- spec engine, gamma 0: that same engine decoding plainly (what loading a draft costs by itself);
- spec gamma 4: that engine drafting 4 tokens every block (what a fixed length would give).

tok/s as in engine.bench.cpu_backends (generated tokens over the whole call). The last line is one JSON
object: the means, the per-prompt median ratio of spec auto to plain, and the probes' cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from engine.bench.cpu_backends import cpu_description, engine_generate, probe_figures
from engine.bundled import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.engine_thread import on_engine_thread
from engine.generate import Engine
from engine.load import chat_prompt, load_engine

CONTENDERS = ("plain", "spec auto", "spec engine, gamma 0", "spec gamma 4")


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = load_engine(args.target, args.draft, backend=args.backend, gamma="auto", max_seq_len=2048)
    plain = load_engine(args.target, None, backend=args.backend, max_seq_len=2048)
    runs: dict[str, tuple[Engine, int | str]] = {
        "plain": (plain, 0),
        "spec auto": (spec, "auto"),
        "spec engine, gamma 0": (spec, 0),
        "spec gamma 4": (spec, 4),
    }
    lines = Path(args.prompts).read_text().splitlines()
    items = [json.loads(line) for line in lines if line.strip()][: args.limit]
    texts = [item["prompt"] for item in items]
    warm = chat_prompt(spec.tokenizer, [{"role": "user", "content": "Hi"}])
    for engine, gamma in runs.values():
        engine_generate(engine, warm, 8, gamma)
    tok_s: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    kinds: list[str] = []
    for round_ in range(args.rounds):
        for i, text in enumerate(texts):
            prompt = chat_prompt(spec.tokenizer, [{"role": "user", "content": text}])
            order = CONTENDERS if (i + round_) % 2 == 0 else CONTENDERS[::-1]
            row = {}
            for name in order:
                engine, gamma = runs[name]
                row[name] = engine_generate(engine, prompt, args.max_new_tokens, gamma)[0].tok_s
                tok_s[name].append(row[name])
            kinds.append(items[i].get("kind", "?"))
            print(round_, i, {name: round(value, 2) for name, value in row.items()}, flush=True)
    speculation = spec.speculation
    return {
        "machine": cpu_description(),
        "mean_tok_s": {name: statistics.mean(values) for name, values in tok_s.items()},
        "spec_auto_over_plain_median": statistics.median(
            a / b for a, b in zip(tok_s["spec auto"], tok_s["plain"], strict=True)
        ),
        "by_kind_over_plain": {
            kind: {
                name: statistics.mean(v for v, k in zip(tok_s[name], kinds, strict=True) if k == kind)
                / statistics.mean(v for v, k in zip(tok_s["plain"], kinds, strict=True) if k == kind)
                for name in CONTENDERS
            }
            for kind in sorted(set(kinds))
        },
        **probe_figures(speculation),
    }


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="native", choices=["native", "ggml"])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--prompts", default="bench/prompts.jsonl")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    print(json.dumps(run(parser.parse_args())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
