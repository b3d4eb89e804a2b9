"""Fakes for unit tests: tiny random Hugging Face models of each architecture, and a toy tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.config import ModelArgs
from engine.generate import Engine
from engine.model import Transformer
from engine.weights import build_model

TINY_VOCAB = 96

_BASE: dict[str, Any] = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
}

# One tiny config per architecture the engine claims: the features each exercises are in the name.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama2": {
        **_BASE,
        "model_type": "llama",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "llama3-rope-scaling": {
        **_BASE,
        "model_type": "llama",
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "smollm2-tied": {**_BASE, "model_type": "llama", "tie_word_embeddings": True, "num_key_value_heads": 1},
    "qwen2-bias": {
        **_BASE,
        "model_type": "qwen2",
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "mistral-sliding-window": {**_BASE, "model_type": "mistral", "sliding_window": 7},
}


def tiny_hf_model(kind: str, seed: int = 0, init_std: float = 0.02, **overrides: Any) -> Any:
    """A transformers model of `kind` (a key of TINY_CONFIGS) with random fp32 weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = {**TINY_CONFIGS[kind], **overrides, "initializer_range": init_std}
    config = AutoConfig.for_model(**config_dict)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Norm weights start at 1 and biases at 0: perturb them so the test sees them used.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    return model.eval()


def engine_model_from_hf(
    hf_model: Any, max_seq_len: int = 256, dtype: torch.dtype = torch.float32
) -> Transformer:
    args = ModelArgs.from_hf_config(hf_model.config.to_dict())
    state = hf_model.state_dict()
    return build_model(args, state.__getitem__, max_seq_len=max_seq_len, dtype=dtype, device="cpu")


def perturbed_copy(hf_model: Any, scale: float, seed: int) -> Any:
    """A draft that mostly agrees with its target: the same weights plus relative noise."""
    import copy

    draft = copy.deepcopy(hf_model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(scale * param.std() * torch.randn(param.shape, generator=generator))
    return draft


class FakeTokenizer:
    """Token i decodes to the word ' w{i}'; id 0 is EOS and decodes to nothing."""

    eos_token_id = 0

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if i == 0 and skip_special_tokens else f" w{i}" for i in token_ids)


def tiny_engine(
    kind: str = "llama2",
    draft: str | None = "perturbed",
    *,
    seed: int = 0,
    gamma: int | str = 4,
    max_seq_len: int = 256,
    init_std: float = 0.02,
    draft_noise: float = 0.5,
    eos: bool = False,
    **overrides: Any,
) -> Engine:
    """An engine on a tiny random target; draft 'perturbed' (agrees often), 'independent', or None."""
    target_hf = tiny_hf_model(kind, seed, init_std, **overrides)
    draft_hf = None
    if draft == "perturbed":
        draft_hf = perturbed_copy(target_hf, draft_noise, seed + 1000)
    elif draft == "independent":
        draft_hf = tiny_hf_model(kind, seed + 1000, init_std, **overrides)
    return Engine(
        engine_model_from_hf(target_hf, max_seq_len),
        engine_model_from_hf(draft_hf, max_seq_len) if draft_hf is not None else None,
        FakeTokenizer(),
        eos_ids=(0,) if eos else (),
        gamma=gamma,
    )
