"""Building an `Engine` from model names or paths: weights, tokenizer, end-of-sequence ids, checks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from engine.generate import Clock, Engine
from engine.models import Log, log_to_stderr, resolve
from engine.quant import QUANT_MODES, QuantMode, quantize
from engine.weights import load_checkpoint

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


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


def load_engine(
    target: str,
    draft: str | None = None,
    *,
    dtype: str = "bf16",
    device: str = "cpu",
    max_seq_len: int = 4096,
    gamma: int | str = 4,
    quant: QuantMode = "none",
    draft_quant: QuantMode = "none",
    static_shapes: bool | None = None,
    clock: Clock = time.perf_counter,
    log: Log = log_to_stderr,
) -> Engine:
    """Loads the target (and the draft, unless None) by bundled name, checkpoint directory or .gguf.

    `gamma` is the number of drafted tokens per block or "auto"; `quant` / `draft_quant` store the
    target's / draft's linear layers as int8 or int4 (CPU). A quantised draft never changes the output;
    a quantised target is a different target. `static_shapes` (default: on for CUDA) runs decode steps
    as fixed-shape forwards captured as CUDA graphs.
    """
    torch_dtype = parse_dtype(dtype)
    for mode in (quant, draft_quant):
        if mode not in QUANT_MODES:
            raise ValueError(f"unknown quantisation {mode!r}; choose one of {', '.join(QUANT_MODES)}")
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be >= 2, got {max_seq_len}")
    target_dir = resolve(target, log=log)
    draft_dir = resolve(draft, log=log) if draft is not None else None
    tokenizer = load_tokenizer(target_dir)
    if draft_dir is not None:
        check_same_vocabulary(tokenizer, load_tokenizer(draft_dir))
    target_model = quantize(
        load_checkpoint(target_dir, max_seq_len=max_seq_len, dtype=torch_dtype, device=device), quant
    )
    draft_model = None
    if draft_dir is not None:
        draft_model = load_checkpoint(draft_dir, max_seq_len=max_seq_len, dtype=torch_dtype, device=device)
        draft_model = quantize(draft_model, draft_quant)
    eos_ids = eos_ids_of(target_dir, tokenizer)
    if static_shapes is None:
        static_shapes = torch.device(device).type == "cuda"
    return Engine(
        target_model,
        draft_model,
        tokenizer,
        eos_ids=eos_ids,
        gamma=gamma,
        static_shapes=static_shapes,
        clock=clock,
    )


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` under the model's chat template, ending with the assistant's turn."""
    if tokenizer.chat_template is None:
        raise ValueError("this model's tokenizer has no chat template; pass a plain prompt instead")
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
