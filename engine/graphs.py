"""Static-shape forwards for decoding: captured as CUDA graphs on a GPU, run eagerly elsewhere.

At batch 1 a decode step is a few hundred small kernels; launching them from Python costs more than
running them on a fast GPU. A CUDA graph records the launches once and replays them with one call. That
needs fixed shapes and fixed addresses, so each `StaticForward` owns its input buffers (token ids,
positions) for one token count on one cache, attends the whole cache (the causal mask hides the slots not
yet written), and returns the same output buffer every time. The same code runs eagerly on the CPU,
which is how the tests check it.

The draft's one-token step and the target's (gamma + 1)-token verify are the shapes that repeat; the
engine keeps one `StaticForward` per (token count, logits mode) per cache, made on first use.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.model import KVCache, LogitsMode, Transformer

MAX_STATIC_TOKENS = 16  # larger forwards (prefill chunks) run eagerly with the shapes they have
WARMUP_RUNS = 3


class StaticForward:
    """`model(tokens, positions, cache)` for exactly `n_tokens` tokens, replayable."""

    def __init__(
        self, model: Transformer, cache: KVCache, n_tokens: int, logits: LogitsMode, capture: bool
    ) -> None:
        assert 0 < n_tokens <= cache.max_seq_len, (n_tokens, cache.max_seq_len)
        device = model.device
        self.model, self.cache, self.logits = model, cache, logits
        self.offsets = torch.arange(n_tokens, device=device)
        self.tokens = torch.zeros(n_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(n_tokens, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: Tensor | None = None
        if capture:
            self._capture()

    def _run(self) -> Tensor | None:
        return self.model(self.tokens, self.positions, self.cache, self.cache.max_seq_len, logits=self.logits)

    def _capture(self) -> None:
        # Warm-up runs execute for real and write keys/values: point them at the cache's last slots and
        # put those slots back afterwards, so a capture in the middle of a conversation changes nothing.
        n_tokens = self.offsets.shape[0]
        torch.add(self.offsets, self.cache.max_seq_len - n_tokens, out=self.positions)
        saved = [t[..., -n_tokens:, :].clone() for t in (self.cache.k, self.cache.v)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(WARMUP_RUNS):
                self._run()
        torch.cuda.current_stream().wait_stream(stream)
        for cache_tensor, kept in zip((self.cache.k, self.cache.v), saved, strict=True):
            cache_tensor[..., -n_tokens:, :].copy_(kept)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.inference_mode():
            self.output = self._run()

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, start: int) -> Tensor | None:
        """tokens: [n_tokens] int64 on the model's device, at positions start.. -> logits or None.

        With a graph the returned tensor is the graph's own output buffer: use it before the next call.
        """
        self.tokens.copy_(tokens, non_blocking=True)
        torch.add(self.offsets, start, out=self.positions)
        if self.graph is None:
            return self._run()
        self.graph.replay()
        return self.output


class StaticForwards:
    """The static forwards of one model on one cache, made on first use of each shape."""

    def __init__(self, model: Transformer, cache: KVCache) -> None:
        self.model, self.cache = model, cache
        self.capture = model.device.type == "cuda"
        self._forwards: dict[tuple[int, LogitsMode], StaticForward] = {}

    def fits(self, n_tokens: int) -> bool:
        return n_tokens <= min(MAX_STATIC_TOKENS, self.cache.max_seq_len)

    def __call__(self, tokens: Tensor, start: int, logits: LogitsMode) -> Tensor | None:
        key = (tokens.shape[0], logits)
        if key not in self._forwards:
            self._forwards[key] = StaticForward(self.model, self.cache, key[0], logits, self.capture)
        return self._forwards[key](tokens, start)
