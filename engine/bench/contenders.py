"""The things `python -m engine bench` times: the engine (plain, speculative, other weight formats) and
transformers' own `generate` (plain and assisted) on the same checkpoints, dtype and threads."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.generate import Engine
from engine.sampling import SamplingParams

Clock = Callable[[], float]


@dataclass(frozen=True)
class Result:
    token_ids: list[int]
    seconds: float  # wall time of the whole call, prefill included
    acceptance_rate: float | None = None
    mean_accepted_len: float | None = None

    @property
    def tok_s(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class EngineContender:
    """The engine at one configuration; gamma 0 is plain decoding through the same code path."""

    name: str
    engine: Engine
    gamma: int | str
    clock: Clock = time.perf_counter

    def run(self, prompt: list[int], max_new_tokens: int) -> Result:
        params = SamplingParams(max_new_tokens=max_new_tokens)
        started = self.clock()
        token_ids: list[int] = []
        stats = None
        for block in self.engine.new_conversation().generate(prompt, params, gamma=self.gamma):
            token_ids.extend(block.token_ids)
            stats = block.stats or stats
        seconds = self.clock() - started
        assert stats is not None
        if stats.n_drafts == 0:
            return Result(token_ids, seconds)
        return Result(token_ids, seconds, stats.acceptance_rate, stats.mean_accepted_len)


@dataclass
class HFContender:
    """transformers' `generate`, greedy; with `assistant` it is assisted (speculative) generation."""

    name: str
    model: Any
    eos_ids: Sequence[int]
    assistant: Any = None
    clock: Clock = time.perf_counter

    def run(self, prompt: list[int], max_new_tokens: int) -> Result:
        input_ids = torch.tensor([prompt], device=self.model.device)
        config = copy.deepcopy(self.model.generation_config)
        config.update(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(self.eos_ids),
            pad_token_id=self.eos_ids[0],
        )
        extra = {} if self.assistant is None else {"assistant_model": self.assistant}
        started = self.clock()
        with torch.inference_mode():
            output = self.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **extra
            )
        seconds = self.clock() - started
        generated = output[0, len(prompt) :].tolist()
        for i, token in enumerate(generated):  # transformers pads after EOS in some paths
            if token in self.eos_ids:
                generated = generated[: i + 1]
                break
        return Result(generated, seconds)


def load_hf_pair(target_dir: Any, draft_dir: Any, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(draft_dir), dtype=dtype).eval()
    return target, draft


def raw_forward_s(engine: Engine, position: int, repeats: int = 12) -> float:
    """Seconds of one bare one-token target forward (with the head), no engine around it."""
    model = engine.target
    cache = model.new_cache()
    ids = torch.randint(0, model.args.vocab_size, (position + 1,))
    with torch.inference_mode():
        model(ids[:position], torch.arange(position), cache, position, logits="none")
        step = (ids[position:], torch.tensor([position]), cache, position + 1)
        for _ in range(3):
            model(*step, logits="last")
        started = time.perf_counter()
        for _ in range(repeats):
            model(*step, logits="last")
    return (time.perf_counter() - started) / repeats


def plain_decode_s_per_token(engine: Engine, prompt: list[int], n: int) -> float:
    """Seconds per token of the engine's plain decoding, prefill excluded."""
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    blocks = list(engine.new_conversation().generate(prompt, params, gamma=0))
    stats = blocks[-1].stats
    assert stats is not None
    return stats.ms_per_token / 1000
