"""A model's view of a conversation (its cache and how much of it is valid) and the committed block.

Shapes: T = ids in a forward, V = vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.engine_thread import on_engine_thread
from engine.ggml import GgmlCache, GgmlModel
from engine.graphs import StaticForwards
from engine.metrics import BlockTiming, GenerationStats
from engine.model import KVCache, LogitsMode, Transformer

Clock = Callable[[], float]
Model = Transformer | GgmlModel  # the same forward on PyTorch's kernels or on llama.cpp's (engine/ggml.py)
PREFILL_CHUNK = 512  # bounds the [T, S] attention mask and activations of a long prompt
FUSED_PREFILL = 64  # a prompt's last ids (up to this many) reach the target with its first verification


@dataclass(frozen=True)
class CommittedBlock:
    """Tokens the target has committed in one verification (accepted drafts + one recovered/bonus)."""

    token_ids: tuple[int, ...]
    text: str  # the text these tokens add (may hold back a partial character or stop-string prefix)
    n_drafted: int
    n_accepted: int
    position: int  # index in the conversation of the block's first token
    timing: BlockTiming
    finish_reason: str | None = None  # "stop", "length" or "cancelled" on the last block
    stats: GenerationStats | None = None  # on the last block


@dataclass
class ModelState:
    """One model's view of a conversation: its cache and how many committed ids it holds."""

    model: Model
    cache: KVCache | GgmlCache
    valid: int = 0
    static: StaticForwards | None = None  # decode-sized forwards with fixed shapes (CUDA graphs)
    # [1, V]: the logits after this model's `valid` ids, left by a forward that ended at the conversation's
    # committed ids (a turn score that fed the reply's prompt, engine/turn_end.py): the next generation of
    # exactly those ids starts from them instead of feeding the last id again. Any feed drops them.
    next_logits: Tensor | None = None

    @on_engine_thread
    @torch.inference_mode()
    def feed(self, tokens: Sequence[int] | Tensor, start: int, logits: LogitsMode | int) -> Tensor | None:
        """Runs `tokens` at positions start.. and returns their logits ([T, V], [1, V], the last k or None).

        `tokens` may already be a device tensor (drafted ids), which avoids a host round trip. With static
        forwards the logits may be a reused buffer: consume them before the next `feed`.
        """
        self.next_logits = None
        device = self.model.device
        ids = tokens if isinstance(tokens, Tensor) else torch.tensor(tokens, dtype=torch.long, device=device)
        n_tokens = ids.shape[0]
        if self.static is not None and logits in ("all", "last") and self.static.fits(n_tokens):  # decode
            return self.static(ids, start, logits)
        positions = torch.arange(start, start + n_tokens, device=device)
        return self.model(ids, positions, self.cache, start + n_tokens, logits=logits)

    def take_next_logits(self) -> Tensor:
        """The held logits (`next_logits`), once; the caller has checked `valid` reaches the committed ids."""
        logits, self.next_logits = self.next_logits, None
        if logits is None:
            raise RuntimeError("no logits are held after the committed ids: feed the last one again")
        return logits

    @classmethod
    @on_engine_thread  # the caches' memory is first touched by the thread that will compute on it
    def create(cls, model: Model, static_shapes: bool, max_seq_len: int | None = None) -> ModelState:
        cache = model.new_cache(max_seq_len)
        static = None
        if static_shapes and isinstance(model, Transformer) and isinstance(cache, KVCache):  # CUDA graphs
            static = StaticForwards(model, cache)
        return cls(model, cache, static=static)


def shared_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many ids `a` and `b` share from their start: what a cache of one keeps for the other."""
    shared = 0
    for old, new in zip(a, b, strict=False):
        if old != new:
            break
        shared += 1
    return shared


def prefill_state(state: ModelState, tokens: list[int], leave: int = 1) -> None:
    """Feeds the ids the state has not cached yet, all but the last `leave` (>= 1: the last id's logits
    start the first block, which may as well carry a few more ids than that)."""
    end = len(tokens) - leave
    for start in range(state.valid, end, PREFILL_CHUNK):
        state.feed(tokens[start : min(end, start + PREFILL_CHUNK)], start, "none")
    state.valid = max(state.valid, end)
