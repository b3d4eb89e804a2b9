"""The engine's model code computes what transformers computes for the same weights."""

import pytest
import torch

from engine.config import ModelArgs
from tests.fakes import TINY_CONFIGS, TINY_VOCAB, engine_model_from_hf, tiny_hf_model


@pytest.mark.parametrize("kind", list(TINY_CONFIGS))
def test_logits_equal_transformers(kind: str) -> None:
    hf = tiny_hf_model(kind, seed=3)
    model = engine_model_from_hf(hf, max_seq_len=128)
    ids = torch.randint(0, TINY_VOCAB, (48,), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]  # [T, V]
    got = model(ids, torch.arange(48), model.new_cache(), kv_len=48)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["llama3-rope-scaling", "qwen2-bias", "mistral-sliding-window"])
def test_incremental_decoding_equals_one_forward(kind: str) -> None:
    """Prefill, then steps of 1 and 3 tokens through the static cache, give the full forward's logits."""
    model = engine_model_from_hf(tiny_hf_model(kind, seed=5), max_seq_len=64)
    ids = torch.randint(0, TINY_VOCAB, (30,), generator=torch.Generator().manual_seed(1))
    full = model(ids, torch.arange(30), model.new_cache(), kv_len=30)
    cache = model.new_cache()
    pieces = [model(ids[:20], torch.arange(20), cache, kv_len=20)]
    for start, end in [(20, 21), (21, 24), (24, 25), (25, 30)]:
        pieces.append(model(ids[start:end], torch.arange(start, end), cache, kv_len=end))
    torch.testing.assert_close(torch.cat(pieces), full, rtol=1e-5, atol=1e-5)


def test_sliding_window_limits_attention() -> None:
    """Mistral's window: a token more than `sliding_window` back no longer changes the logits."""
    model = engine_model_from_hf(tiny_hf_model("mistral-sliding-window", seed=2, num_hidden_layers=1))
    ids = torch.randint(1, TINY_VOCAB, (20,), generator=torch.Generator().manual_seed(4))
    changed = ids.clone()
    changed[0] = (ids[0] + 1) % TINY_VOCAB
    last = [model(x, torch.arange(20), model.new_cache(), kv_len=20)[-1] for x in (ids, changed)]
    torch.testing.assert_close(last[0], last[1])  # one layer, window 7: position 0 is out of reach


def test_config_reads_legacy_rope_scaling() -> None:
    """Checkpoints written before transformers 5 keep rope_theta and rope_scaling at the top level."""
    config = {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    args = ModelArgs.from_hf_config(config)
    assert args.rope_theta == 500000.0 and args.rope_scaling is not None and args.rope_scaling.factor == 8.0
    assert abs(args.n_params - 8.03e9) < 0.01e9  # Llama-3-8B


def test_unsupported_architecture_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        ModelArgs.from_hf_config({"model_type": "gpt2"})
