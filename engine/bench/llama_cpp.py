"""llama.cpp itself as a measured contender: llama-cpp-python's `Llama` on the same GGUF file, greedy.

This is what a Pipecat or LiveKit user runs on a CPU (llama-server uses the same kernels), so the engine's
CPU figures are stated as ratios to it, measured on the same machine in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Clock = Callable[[], float]


@dataclass(frozen=True)
class Timed:
    """One greedy generation: its ids, prompt evaluation and decoding seconds (first token in prefill)."""

    token_ids: list[int]
    prefill_s: float  # prompt evaluation and the first token's logits
    decode_s: float  # every later token

    @property
    def decode_tok_s(self) -> float:
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def tok_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return len(self.token_ids) / total if total > 0 else 0.0


class LlamaCpp:
    """`llama_cpp.Llama` with the engine's thread count, greedy (top-k 1, no repetition penalty)."""

    def __init__(self, gguf: Path, n_threads: int, n_ctx: int = 4096, clock: Clock = time.perf_counter):
        from llama_cpp import Llama

        self.llm: Any = Llama(
            model_path=str(gguf),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            verbose=False,
        )
        self.clock = clock

    def generate(self, prompt: list[int], max_new_tokens: int, eos_ids: Iterable[int]) -> Timed:
        """Greedy ids after `prompt` up to an end id or `max_new_tokens` (the prompt evaluated anew)."""
        stop = set(eos_ids)
        self.llm.reset()
        ids: list[int] = []
        started = self.clock()
        first_at = started
        stream = self.llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True)
        for token in stream:
            if not ids:
                first_at = self.clock()
            ids.append(int(token))
            if token in stop or len(ids) >= max_new_tokens:
                break
        return Timed(ids, first_at - started, self.clock() - first_at)

    def prompt_eval_s(self, cached: list[int], new: list[int]) -> float:
        """Seconds to evaluate `new` ids after `cached` ones (llama.cpp's prompt-eval of a turn's ids)."""
        self.llm.reset()
        self.llm._ctx.kv_cache_clear()  # the eval must not find the ids cached from the last call
        self.llm.eval(cached)
        started = self.clock()
        self.llm.eval(new)
        return self.clock() - started
