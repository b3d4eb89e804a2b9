"""Building an `Engine` from model names or paths: weights, tokenizer, end-of-sequence ids, checks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from engine import turn_head
from engine.config import ModelArgs
from engine.cpu_kernels import kernels_build
from engine.engine_thread import on_engine_thread
from engine.generate import Clock, Engine, Model
from engine.ggml import GgmlModel
from engine.ggml_draft import ggml_draft_gguf
from engine.gguf_int4 import gguf_file_of, kernel_runs, load_gguf_int4, load_native_draft
from engine.model import Transformer
from engine.models import Log, log_to_stderr, resolve, resolve_gguf
from engine.options import NGRAM_DRAFT, EngineOptions, parse_dtype
from engine.quant import GGUF_A8, GGUF_LOADS, QuantMode, quantize
from engine.weights import load_checkpoint


def load_tokenizer(path: Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


# End-of-turn / end-of-text markers of the supported families, honoured when the vocabulary has them (the
# upstream Qwen2.5 and Llama-3 generation configs list two ids; converted GGUFs keep only one).
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>")


def eos_ids_of(path: Path, tokenizer: Any) -> set[int]:
    """End-of-sequence ids from generation_config.json, config.json and the tokenizer, merged."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        file = Path(path) / name
        if file.is_file():
            value = json.loads(file.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    special = set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab())
    ids.update(tokenizer.convert_tokens_to_ids(token) for token in END_TOKENS if token in special)
    return ids


def check_same_vocabulary(target_tokenizer: Any, draft_tokenizer: Any) -> None:
    if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError(
            "the draft model's tokenizer differs from the target's; speculative decoding needs a draft "
            "that shares the target's vocabulary (e.g. qwen2.5-coder-0.5b-instruct for the 1.5b)"
        )


@on_engine_thread  # its weights' memory, calibration and warm caches belong to the thread that computes
def load_engine(
    options: EngineOptions | str,
    draft: str | None = None,
    *,
    clock: Clock = time.perf_counter,
    log: Log = log_to_stderr,
    **settings: Any,
) -> Engine:
    """Loads the engine `options` describe: `load_engine(EngineOptions(target, draft, gamma="auto"))`, or
    with the same fields as arguments, `load_engine(target, draft, dtype="fp32", max_seq_len=512)`."""
    if not isinstance(options, EngineOptions):
        options = EngineOptions(options, draft, **settings)
    elif draft is not None or settings:
        raise ValueError("give load_engine EngineOptions or a target with settings, not both")
    torch_dtype = parse_dtype(options.dtype)
    target_dir = resolve(options.target, log=log)
    ngram_drafts = options.draft == NGRAM_DRAFT
    draft_dir = resolve(options.draft, log=log) if options.draft not in (None, NGRAM_DRAFT) else None
    tokenizer = load_tokenizer(target_dir)
    if draft_dir is not None:
        check_same_vocabulary(tokenizer, load_tokenizer(draft_dir))

    def load(name: str, directory: Path, quant: QuantMode, dtype: torch.dtype = torch_dtype) -> Transformer:
        if quant in GGUF_LOADS:  # the GGUF's own weights (engine/gguf_int4.py), not a re-quantisation
            args = ModelArgs.from_json(directory / "config.json")
            gguf_file = gguf_file_of(name, log)
            return load_gguf_int4(
                gguf_file,
                args,
                max_seq_len=options.max_seq_len,
                dtype=dtype,
                device=options.device,
                log=log,
                quant=quant,
            )
        return quantize(
            load_checkpoint(
                directory, max_seq_len=options.max_seq_len, dtype=torch_dtype, device=options.device
            ),
            quant,
        )

    target_model: Model
    draft_model: Model | None
    if options.backend in ("ggml", "native"):
        target_gguf = resolve_gguf(options.target, log=log)
        native = options.backend == "native" and kernel_runs(target_gguf)
        if options.backend == "native" and not native:
            log(f"native: {options.target} is not a qwen2 GGUF; its target runs on llama.cpp's kernels")
        if native and not kernels_build(log):
            native = False
        if native:  # the engine's own kernel on the target's GGUF blocks, fp32 rows
            target_model = load(options.target, target_dir, GGUF_A8, torch.float32)
        else:
            target_model = GgmlModel(target_gguf, options.max_seq_len)
        draft_model = None
        if draft_dir is not None and options.draft is not None:
            draft_gguf = ggml_draft_gguf(options.draft, log=log)
            if native and kernel_runs(draft_gguf):  # the draft on the engine's kernels too
                draft_model = load_native_draft(
                    draft_gguf,
                    ModelArgs.from_json(draft_dir / "config.json"),
                    max_seq_len=options.max_seq_len,
                    first_special=min(tokenizer.get_added_vocab().values(), default=10**9),
                    log=log,
                )
            else:
                draft_model = GgmlModel(draft_gguf, options.max_seq_len)
    else:
        target_model = load(options.target, target_dir, options.quant)
        draft_model = None
        if draft_dir is not None and options.draft is not None:
            draft_model = load(options.draft, draft_dir, options.draft_quant)
    static_shapes = options.static_shapes
    if static_shapes is None:
        static_shapes = torch.device(options.device).type == "cuda"
    engine = Engine(
        target_model,
        draft_model,
        tokenizer,
        eos_ids=eos_ids_of(target_dir, tokenizer),
        gamma=options.gamma,
        static_shapes=static_shapes,
        clock=clock,
        ngram_drafts=ngram_drafts,
    )
    for role, name in (("target", options.target), ("draft", options.draft if draft_model else None)):
        head = turn_head.for_model(name)
        if head is not None:
            engine.turn_heads[role] = head
    if options.gamma == "auto" and (draft_model is not None or ngram_drafts):
        engine.calibrate()  # the adaptive length's cost table, timed once here rather than in a first reply
    return engine


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` under the model's chat template, ending with the assistant's turn."""
    if tokenizer.chat_template is None:
        raise ValueError("this model's tokenizer has no chat template; pass a plain prompt instead")
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
