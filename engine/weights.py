"""Weights: Hugging Face checkpoints (safetensors directories) into the engine's model, and GGUF conversion.

Hugging Face names map onto the engine's fused layout: q/k/v become one `wqkv`, gate/up one `w13`.
A GGUF file is read once through transformers + gguf (dequantised), then written as a safetensors
directory; every write goes to a temporary directory that is renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from engine.config import ModelArgs
from engine.model import Transformer, rope_tables

GetTensor = Callable[[str], Tensor]


def engine_state_dict(
    args: ModelArgs, get: GetTensor, dtype: torch.dtype, device: str | torch.device
) -> Iterator[tuple[str, Tensor]]:
    """Yields the engine's parameters, built from Hugging Face-named tensors fetched one at a time.

    Every yielded tensor owns its memory: none stays a view of a memory-mapped checkpoint file, so the
    file can be unmapped after loading (otherwise its pages would stay resident beside the fused copies).
    """

    def own(name: str) -> Tensor:
        return get(name).to(device=device, dtype=dtype, copy=True)

    def fused(*names: str) -> Tensor:
        return torch.cat([get(name).to(device=device, dtype=dtype) for name in names])  # cat copies

    yield "tok_embeddings.weight", own("model.embed_tokens.weight")
    yield "norm.weight", own("model.norm.weight")
    if not args.tie_embeddings:
        yield "output.weight", own("lm_head.weight")
    for i in range(args.n_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        attn = f"{hf}.self_attn"
        yield f"{ours}.attention_norm.weight", own(f"{hf}.input_layernorm.weight")
        yield f"{ours}.ffn_norm.weight", own(f"{hf}.post_attention_layernorm.weight")
        yield f"{ours}.attention.wqkv.weight", fused(*(f"{attn}.{p}_proj.weight" for p in "qkv"))
        if args.qkv_bias:
            yield f"{ours}.attention.wqkv.bias", fused(*(f"{attn}.{p}_proj.bias" for p in "qkv"))
        yield f"{ours}.attention.wo.weight", own(f"{attn}.o_proj.weight")
        yield (
            f"{ours}.feed_forward.w13.weight",
            fused(f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"),
        )
        yield f"{ours}.feed_forward.w2.weight", own(f"{hf}.mlp.down_proj.weight")


def build_model(
    args: ModelArgs, get: GetTensor, *, max_seq_len: int, dtype: torch.dtype, device: str | torch.device
) -> Transformer:
    """The engine's model with weights from `get` (Hugging Face names), without a random-init pass."""
    with torch.device("meta"):
        model = Transformer(args, max_seq_len)
    state = dict(engine_state_dict(args, get, dtype, device))
    model.load_state_dict(state, strict=True, assign=True)
    cos, sin = rope_tables(args, max_seq_len)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    return model.eval().requires_grad_(False)


def load_checkpoint(
    path: Path, *, max_seq_len: int, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> Transformer:
    """Loads a Hugging Face checkpoint directory (config.json + *.safetensors, sharded or not)."""
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{path} is not a Hugging Face checkpoint: it has no config.json")
    args = ModelArgs.from_json(config_path)
    files = _safetensors_files(path)
    with ExitStack() as stack:
        handles = {
            f: stack.enter_context(safe_open(str(path / f), framework="pt")) for f in set(files.values())
        }

        def get(name: str) -> Tensor:
            if name not in files:
                raise ValueError(f"checkpoint {path} has no tensor {name!r}")
            return handles[files[name]].get_tensor(name)

        return build_model(args, get, max_seq_len=max_seq_len, dtype=dtype, device=device)


def _safetensors_files(path: Path) -> dict[str, str]:
    """Tensor name -> file, from model.safetensors.index.json or the directory's single file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    singles = sorted(path.glob("*.safetensors"))
    if len(singles) != 1:
        raise ValueError(f"{path} must hold one *.safetensors file or an index; found {len(singles)}")
    with safe_open(str(singles[0]), framework="pt") as handle:
        return {name: singles[0].name for name in handle.keys()}


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Dequantises a GGUF checkpoint through transformers and writes a safetensors directory at `out_dir`.

    The result holds config.json, model.safetensors, generation_config.json and the tokenizer files.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy import, only when converting

    gguf_path = Path(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    hf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = hf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    state = {
        name: tensor.to(dtype).contiguous()
        for name, tensor in hf_model.state_dict().items()
        if not (config.get("tie_word_embeddings") and name == "lm_head.weight")
    }
    generation_config = hf_model.generation_config.to_dict()
    del hf_model

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
        tokenizer.save_pretrained(str(tmp))

    return write_directory_atomically(out_dir, write)


def write_directory_atomically(out_dir: Path, write: Callable[[Path], Any]) -> Path:
    """Runs `write(tmp)` on a fresh temporary sibling of `out_dir`, then renames it into place.

    A crash or error leaves no half-written `out_dir`; an older `out_dir` is replaced.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
