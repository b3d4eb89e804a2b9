"""A compact Llama-family transformer with a static KV cache, batch 1.

Shapes: T = tokens in this forward, S = key positions attended (kv_len), H = query heads, KVH = key/value
heads, D = head_dim, V = vocabulary. The cache is indexed by absolute position, so rolling back after a
rejected draft is simply attending fewer positions next time: the stale slots get overwritten.

`Transformer.between_layers`, when set, runs between a forward's layers: a caller that shares the CPU with
other work (voiceagent/cpu_lane.py: speech recognition and synthesis) may hold the forward there, so the
two take turns within a forward instead of sharing the cores. It is not set on a GPU (CUDA graphs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.config import ModelArgs, RopeScaling

LogitsMode = Literal["all", "last", "none"]


class KVCache:
    """Keys and values of one conversation for one model: [n_layers, 1, KVH, max_seq_len, D] each.

    Allocated once. It holds no length: the caller knows how many leading positions are valid.
    """

    def __init__(self, args: ModelArgs, max_seq_len: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (args.n_layers, 1, args.n_kv_heads, max_seq_len, args.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def copy_prefix_from(self, other: KVCache, n_tokens: int) -> None:
        """Copies `other`'s keys and values of the first `n_tokens` positions into this cache."""
        self.k[:, :, :, :n_tokens].copy_(other.k[:, :, :, :n_tokens])
        self.v[:, :, :, :n_tokens].copy_(other.v[:, :, :, :n_tokens])


class Positions(NamedTuple):
    """Where this forward's tokens sit: shared by every layer of one forward."""

    input_pos: Tensor  # [T] int64 absolute positions
    cos: Tensor  # [T, D] rope tables at those positions, in the activations' dtype
    sin: Tensor
    masks: dict[int | None, Tensor]  # [T, S] bool per sliding window (None = full causal)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32, scale in the model dtype (the order transformers uses, so bf16 rounds alike).
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """[D/2] fp32 inverse frequencies, Llama-3 scaled where the config asks for it."""
    exponents = torch.arange(0, args.head_dim, 2, dtype=torch.int64).float() / args.head_dim
    inv_freq = 1.0 / (args.rope_theta**exponents)
    if args.rope_scaling is not None:
        inv_freq = _llama3_scaled(inv_freq, args.rope_scaling)
    return inv_freq


def _llama3_scaled(inv_freq: Tensor, scaling: RopeScaling) -> Tensor:
    # Long wavelengths are divided by `factor`, short ones kept, the band between interpolated smoothly.
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(args: ModelArgs, max_seq_len: int) -> tuple[Tensor, Tensor]:
    """cos, sin: [max_seq_len, D] fp32, in the rotate-half layout of Hugging Face checkpoints."""
    positions = torch.arange(max_seq_len, dtype=torch.float32)
    freqs = torch.outer(positions, rope_inv_freq(args))  # [max_seq_len, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [1, heads, T, D]; cos, sin: [T, D] in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


# Forwards of at most this many ids attend row by row on the engine's CPU kernel where a model asks for it
# (`Attention.row_by_row`): decode steps, verifies, and a first block that carries a prompt's last ids
# (engine.state.FUSED_PREFILL = 64, plus up to 9 verified): plain and speculative first blocks then differ
# in their number of rows only. It costs about what torch's attention does up to here (forward of 64 ids
# after 100 / 500 cached: 243 / 322 ms against 253 / 294; AMD EPYC AVX-512, 2 threads).
ROW_ATTENTION_MAX_IDS = 80


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, window: int | None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.window = window
        # Set by loaders whose activations are rounded to int8 (quant gguf-a8): there a last-bit difference
        # between a verify's rows and one-id steps grows, so short forwards attend row by row, bit-exact.
        self.row_by_row = False
        qkv_dim = (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
        self.wqkv = nn.Linear(args.dim, qkv_dim, bias=args.qkv_bias)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: Tensor, at: Positions, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        # x: [T, dim]; k_cache, v_cache: [1, KVH, max_seq_len, D]
        n_tokens = x.shape[0]
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(n_tokens, self.n_heads, self.head_dim).transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
        k = k.view(n_tokens, self.n_kv_heads, self.head_dim).transpose(0, 1).unsqueeze(0)  # [1, KVH, T, D]
        v = v.view(n_tokens, self.n_kv_heads, self.head_dim).transpose(0, 1).unsqueeze(0)
        q, k = apply_rope(q, at.cos, at.sin), apply_rope(k, at.cos, at.sin)
        k_cache.index_copy_(2, at.input_pos, k)
        v_cache.index_copy_(2, at.input_pos, v)
        if self.row_by_row and n_tokens <= ROW_ATTENTION_MAX_IDS and k_cache.dtype == torch.float32:
            from engine.cpu_kernels import gguf_mm

            rows = gguf_mm().row_attention(
                q[0].transpose(0, 1), k_cache[0], v_cache[0], at.input_pos, self.window or 0
            )  # [T, H, D]
            return self.wo(rows.reshape(n_tokens, q_size))
        mask = at.masks[self.window]
        kv_len = mask.shape[-1]
        out = F.scaled_dot_product_attention(
            q, k_cache[:, :, :kv_len], v_cache[:, :, :kv_len], attn_mask=mask, enable_gqa=True
        )  # [1, H, T, D]
        return self.wo(out.squeeze(0).transpose(0, 1).reshape(n_tokens, q_size))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w13 = nn.Linear(args.dim, 2 * args.intermediate_size, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs, window: int | None) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, window)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)
        # Set by loaders whose layer runs whole on the engine's CPU kernels (engine/cpu_kernels/layer.py):
        # it takes the forwards that attend row by row, in one call.
        self.native: Any | None = None

    def forward(self, x: Tensor, at: Positions, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        # x: [T, dim]; k_cache, v_cache: [1, KVH, max_seq_len, D]
        if self.native is not None and x.shape[0] <= ROW_ATTENTION_MAX_IDS and x.dtype == torch.float32:
            return self.native.forward(x, at.cos, at.sin, at.input_pos, k_cache[0], v_cache[0])
        x = x + self.attention(self.attention_norm(x), at, k_cache, v_cache)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    rope_cos: Tensor  # [max_seq_len, D] fp32 buffers
    rope_sin: Tensor

    def __init__(self, args: ModelArgs, max_seq_len: int) -> None:
        super().__init__()
        self.args = args
        self.max_seq_len = max_seq_len
        self.tok_embeddings: nn.Module = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, window) for window in args.layer_windows)
        self.blocks = cast(list[Block], list(self.layers))  # a typed view of the same modules
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output: nn.Module | None = (
            None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)
        )
        self.quantization = "none"  # or the weight-only format engine.quant applied
        self.between_layers: Callable[[], None] | None = None  # see the module docstring
        cos, sin = rope_tables(args, max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the final norm's: a GGUF load may keep the embedding quantised)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def new_cache(self, max_seq_len: int | None = None) -> KVCache:
        """A cache of `max_seq_len` positions (default and most: the model's rope length)."""
        n = self.max_seq_len if max_seq_len is None else max_seq_len
        if not 2 <= n <= self.max_seq_len:
            raise ValueError(f"a cache holds 2..{self.max_seq_len} positions for this model, got {n}")
        return KVCache(self.args, n, self.dtype, self.device)

    def forward(
        self,
        tokens: Tensor,
        input_pos: Tensor,
        cache: KVCache,
        kv_len: int,
        logits: LogitsMode | int = "all",
    ) -> Tensor | None:
        """tokens, input_pos: [T] int64 -> logits [T, V] fp32 ('all'), [1, V] ('last'), [k, V] (an int k:
        the last k positions) or None ('none').

        Writes the tokens' keys and values into `cache` at `input_pos` and attends the first `kv_len`
        positions, causally. `kv_len` must cover every position in `input_pos`.
        """
        assert tokens.ndim == 1 and tokens.shape == input_pos.shape, (tokens.shape, input_pos.shape)
        assert kv_len <= cache.max_seq_len, (kv_len, cache.max_seq_len)
        x = self.tok_embeddings(tokens)  # [T, dim]
        at = Positions(
            input_pos=input_pos,
            cos=self.rope_cos[input_pos].to(x.dtype),  # [T, D]
            sin=self.rope_sin[input_pos].to(x.dtype),
            masks=attention_masks(input_pos, kv_len, set(self.args.layer_windows)),
        )
        pause = self.between_layers
        for i, layer in enumerate(self.blocks):
            if pause is not None and i:
                pause()
            x = layer(x, at, cache.k[i], cache.v[i])
        if logits == "none":
            return None
        if logits == "last":
            x = x[-1:]
        elif isinstance(logits, int):
            x = x[-logits:]
        x = self.norm(x)
        if self.output is None:
            assert isinstance(self.tok_embeddings, nn.Embedding)  # tied: the head is the embedding matrix
            head_out = F.linear(x, self.tok_embeddings.weight)
        else:
            head_out = self.output(x)
        return head_out.float()


def attention_masks(input_pos: Tensor, kv_len: int, windows: set[int | None]) -> dict[int | None, Tensor]:
    """Causal masks [T, kv_len] (True = attend), one per distinct sliding window (None = full)."""
    key_pos = torch.arange(kv_len, device=input_pos.device)[None, :]  # [1, S]
    query_pos = input_pos[:, None]  # [T, 1]
    causal = key_pos <= query_pos
    return {w: causal if w is None else causal & (key_pos > query_pos - w) for w in windows}
