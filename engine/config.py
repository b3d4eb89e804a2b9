"""Model arguments for the Llama family, read from a Hugging Face `config.json`.

One dataclass covers Llama 2/3 (with Llama-3 rope scaling), Qwen2/2.5 (q/k/v bias), SmolLM2 and Mistral
(sliding-window attention). `NAMED_SHAPES` holds the real architectures' shapes for random-weight timing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 4096
    # Per layer: None for full attention, or the sliding window in tokens.
    layer_windows: tuple[int | None, ...] = ()
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (None,) * self.n_layers)
        if len(self.layer_windows) != self.n_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries, expected {self.n_layers}")

    @property
    def n_params(self) -> int:
        """Parameter count (embeddings counted once when tied)."""
        attn = self.dim * self.head_dim * (self.n_heads * 2 + self.n_kv_heads * 2)
        mlp = 3 * self.dim * self.intermediate_size
        per_layer = attn + mlp + 2 * self.dim
        head = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.vocab_size * self.dim + self.n_layers * per_layer + self.dim + head

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArgs:
        model_type = config.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; the engine runs {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        n_heads = config["num_attention_heads"]
        dim = config["hidden_size"]
        n_layers = config["num_hidden_layers"]
        rope = _rope_parameters(config)
        return cls(
            vocab_size=config["vocab_size"],
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=config.get("num_key_value_heads") or n_heads,
            intermediate_size=config["intermediate_size"],
            head_dim=config.get("head_dim") or dim // n_heads,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_scaling=_rope_scaling(rope),
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            layer_windows=_layer_windows(config, model_type, n_layers),
            model_type=model_type,
        )

    @classmethod
    def from_json(cls, path: Path) -> ModelArgs:
        return cls.from_hf_config(json.loads(Path(path).read_text()))


def _rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes `rope_parameters`; older checkpoints have `rope_theta` + `rope_scaling`."""
    rope = dict(config.get("rope_parameters") or {})
    if "rope_theta" not in rope and "rope_theta" in config:
        rope["rope_theta"] = config["rope_theta"]
    legacy = config.get("rope_scaling")
    if legacy:
        rope = {**legacy, **rope}
        if "rope_type" not in rope and "type" in legacy:
            rope["rope_type"] = legacy["type"]
    return rope


def _rope_scaling(rope: dict[str, Any]) -> RopeScaling | None:
    rope_type = rope.get("rope_type", "default")
    if rope_type in ("default", None):
        return None
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope_type {rope_type!r}; the engine knows 'default' and 'llama3'")
    return RopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )


def _layer_windows(config: dict[str, Any], model_type: str, n_layers: int) -> tuple[int | None, ...]:
    window = config.get("sliding_window")
    if model_type == "qwen2" and not config.get("use_sliding_window", False):
        window = None
    if window is None:
        return (None,) * n_layers
    layer_types = config.get("layer_types")
    if layer_types:
        return tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    if model_type == "qwen2":
        first_sliding = config.get("max_window_layers", n_layers)
        return tuple(window if i >= first_sliding else None for i in range(n_layers))
    return (int(window),) * n_layers


def _llama3(dim: int, n_layers: int, n_heads: int, intermediate: int, tied: bool = False) -> ModelArgs:
    return ModelArgs(
        vocab_size=128256,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=8,
        intermediate_size=intermediate,
        head_dim=dim // n_heads,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192),
        norm_eps=1e-5,
        tie_embeddings=tied,
        max_position_embeddings=131072,
    )


# Real architectures' shapes, for timing with random weights where no checkpoint can be downloaded.
NAMED_SHAPES: dict[str, ModelArgs] = {
    "llama3-70b": _llama3(8192, 80, 64, 28672),
    "llama3-8b": _llama3(4096, 32, 32, 14336),
    "llama3-1b": _llama3(2048, 16, 32, 8192, tied=True),
    "qwen2.5-1.5b": ModelArgs(151936, 1536, 28, 12, 2, 8960, 128, 1e6, None, 1e-6, True, True, 32768),
    "qwen2.5-0.5b": ModelArgs(151936, 896, 24, 14, 2, 4864, 64, 1e6, None, 1e-6, True, True, 32768),
}
