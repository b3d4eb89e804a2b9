"""The `serve` subcommand: vLLM's flag names where they exist (--model, --speculative-model,
--num-speculative-tokens, --speculative-config, --max-model-len, --served-model-name, --api-key, ...)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from engine.cli_flags import add_backend_flag
from engine.options import DEFAULT_OPTIONS, DTYPES, EngineOptions
from engine.quant import QUANT_MODES, QuantMode

# vLLM's --dtype spellings, and the engine's own.
VLLM_DTYPES = {"auto": "bf16", "bfloat16": "bf16", "half": "fp16", "float16": "fp16", "float": "fp32",
               "float32": "fp32", **{name: name for name in DTYPES}}  # fmt: skip


def speculative_tokens(value: str) -> int | str:
    """An integer >= 0, or 'auto' (the engine adapts the speculation length)."""
    if value == "auto":
        return "auto"
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {number}")
    return number


def json_object(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return parsed


def add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="an OpenAI-compatible server, launched with vLLM's flags")
    serve.add_argument("model_tag", nargs="?", help="the model, as `vllm serve MODEL` takes it")
    serve.add_argument(
        "--model", help=f"bundled name, checkpoint dir or .gguf (default {DEFAULT_OPTIONS.target})"
    )
    serve.add_argument(
        "--speculative-model", default=DEFAULT_OPTIONS.draft, help="draft model, or 'none' (plain)"
    )
    serve.add_argument(
        "--num-speculative-tokens", type=speculative_tokens, default=DEFAULT_OPTIONS.gamma,
        help="drafted tokens per verification, or 'auto' for the adaptive length (default 4)",
    )  # fmt: skip
    serve.add_argument(
        "--speculative-config", type=json_object,
        help='newer vLLM\'s spelling, e.g. \'{"model": "...", "num_speculative_tokens": 5}\'; '
        "overrides the two flags above (keys: model, num_speculative_tokens, method, quantization)",
    )  # fmt: skip
    serve.add_argument("--quantization", choices=QUANT_MODES, default="none", help="target weights (CPU)")
    serve.add_argument(
        "--speculative-model-quantization", choices=QUANT_MODES, default="none", help="draft weights (CPU)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--dtype", choices=list(VLLM_DTYPES), default="auto", help="auto is bf16")
    serve.add_argument(
        "--max-model-len", type=int, default=DEFAULT_OPTIONS.max_seq_len,
        help="context (KV cache) length in tokens",
    )  # fmt: skip
    serve.add_argument("--served-model-name", help="the model id clients use (default: the --model value)")
    serve.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY") or None,
        help="require this bearer key (env VLLM_API_KEY)",
    )
    serve.add_argument("--device", default=DEFAULT_OPTIONS.device)
    add_backend_flag(serve)
    serve.add_argument("--max-queue-len", type=int, default=16, help="waiting requests before 429")
    serve.add_argument("--uvicorn-log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(run=run_serve)


@dataclass(frozen=True)
class ServeOptions:
    """The engine to load and how to serve it, resolved from the flags (vLLM's names and aliases)."""

    target: str
    draft: str | None
    gamma: int | str  # an integer, or "auto"
    dtype: str
    model_name: str
    quant: QuantMode = "none"  # weight-only int8/int4 for the target
    draft_quant: QuantMode = "none"
    device: str = DEFAULT_OPTIONS.device
    max_seq_len: int = DEFAULT_OPTIONS.max_seq_len  # --max-model-len
    backend: str = DEFAULT_OPTIONS.backend

    @property
    def engine(self) -> EngineOptions:
        """The engine's own options."""
        return EngineOptions.from_attributes(self)


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """Resolves the flags (and their vLLM aliases) into one set of options; ValueError if they conflict."""
    if args.model_tag and args.model and args.model_tag != args.model:
        raise ValueError(
            f"the model is given twice and differs: {args.model_tag!r} and --model {args.model!r}"
        )
    target = args.model_tag or args.model or DEFAULT_OPTIONS.target
    draft, gamma, draft_quant = (
        args.speculative_model,
        args.num_speculative_tokens,
        args.speculative_model_quantization,
    )
    if args.speculative_config is not None:
        draft, gamma, draft_quant = _from_speculative_config(args.speculative_config, gamma, draft_quant)
    draft = None if draft is None or draft.lower() == "none" else draft
    name = args.served_model_name or target
    dtype = VLLM_DTYPES[args.dtype]
    return ServeOptions(
        target,
        draft,
        gamma,
        dtype,
        name,
        args.quantization,
        draft_quant,
        args.device,
        args.max_model_len,
        args.backend,
    )


def _from_speculative_config(
    config: dict[str, Any], gamma: int | str, quant: QuantMode
) -> tuple[str | None, int | str, QuantMode]:
    unknown = set(config) - {"model", "num_speculative_tokens", "method", "quantization"}
    if unknown:
        raise ValueError(f"--speculative-config: unsupported keys {sorted(unknown)}")
    if config.get("method", "draft_model") != "draft_model":
        raise ValueError(
            f"--speculative-config: only method 'draft_model' is supported, got {config['method']!r}"
        )
    if "model" not in config:
        raise ValueError("--speculative-config needs a 'model' (the draft)")
    if "num_speculative_tokens" in config:
        try:
            gamma = speculative_tokens(str(config["num_speculative_tokens"]))
        except argparse.ArgumentTypeError as error:
            raise ValueError(f"--speculative-config num_speculative_tokens: {error}") from None
    if "quantization" in config:
        if config["quantization"] not in QUANT_MODES:
            raise ValueError(
                f"--speculative-config quantization: choose one of {', '.join(QUANT_MODES)}, "
                f"got {config['quantization']!r}"
            )
        quant = config["quantization"]
    return str(config["model"]), gamma, quant


def run_serve(args: argparse.Namespace) -> int:
    from engine.load import load_engine
    from engine.server.app import ServerConfig, run

    options = serve_options(args)
    engine = load_engine(options.engine)
    fixed_gamma = options.gamma if isinstance(options.gamma, int) and options.draft is not None else None
    config = ServerConfig(
        model_name=options.model_name, api_key=args.api_key or None, max_queue_len=args.max_queue_len,
        num_speculative_tokens=fixed_gamma, model_root=options.target,
    )  # fmt: skip
    draft = options.draft or "none"
    print(
        f"serving {options.model_name} (draft: {draft}, speculative tokens: {options.gamma}) "
        f"on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
    )
    run(engine, config, host=args.host, port=args.port, log_level=args.uvicorn_log_level)
    return 0
