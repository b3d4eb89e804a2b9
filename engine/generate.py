"""The engine: token ids in, committed blocks out.

The engine knows only token ids (and a tokenizer to turn committed ids into text deltas). It is
synchronous and has no notion of asyncio, audio or sockets: `Conversation.generate` is a plain generator
of `CommittedBlock`s. Each block is final: exactly what the target alone would have produced (the same
tokens under greedy decoding, the same distribution when sampling), so a consumer may act on it at once.

A conversation keeps its KV caches between calls. Its only state is the list of committed token ids and,
per model, how many leading ids have their keys and values in the cache (`valid`). A new prompt that shares
a prefix with what is committed re-uses it; anything after the shared prefix is simply overwritten.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.adaptive import DraftLength, SpeculationStats
from engine.detokenize import TextStream, Tokenizer
from engine.fair_lock import FairLock
from engine.ggml import GgmlCache, GgmlModel
from engine.graphs import StaticForwards
from engine.metrics import BlockTiming, EngineMetrics, GenerationStats
from engine.model import KVCache, LogitsMode, Transformer
from engine.sampling import SamplingParams, sample, warp_probs
from engine.speculative import Verdict, verify_greedy, verify_sampled

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

    @torch.inference_mode()
    def feed(self, tokens: Sequence[int] | Tensor, start: int, logits: LogitsMode | int) -> Tensor | None:
        """Runs `tokens` at positions start.. and returns their logits ([T, V], [1, V], the last k or None).

        `tokens` may already be a device tensor (drafted ids), which avoids a host round trip. With static
        forwards the logits may be a reused buffer: consume them before the next `feed`.
        """
        device = self.model.device
        ids = tokens if isinstance(tokens, Tensor) else torch.tensor(tokens, dtype=torch.long, device=device)
        n_tokens = ids.shape[0]
        if self.static is not None and logits in ("all", "last") and self.static.fits(n_tokens):  # decode
            return self.static(ids, start, logits)
        positions = torch.arange(start, start + n_tokens, device=device)
        return self.model(ids, positions, self.cache, start + n_tokens, logits=logits)

    @classmethod
    def create(cls, model: Model, static_shapes: bool, max_seq_len: int | None = None) -> ModelState:
        cache = model.new_cache(max_seq_len)
        static = None
        if static_shapes and isinstance(model, Transformer) and isinstance(cache, KVCache):  # CUDA graphs
            static = StaticForwards(model, cache)
        return cls(model, cache, static=static)


class Conversation:
    """A conversation's caches on one engine. Generations on it run one at a time."""

    def __init__(self, engine: Engine, max_seq_len: int | None = None) -> None:
        """`max_seq_len`: this conversation's cache length (default: the engine's). Every conversation
        holds its own caches, so many short ones (voice sessions) cost far less memory than long ones."""
        self.engine = engine
        self.max_seq_len = engine.max_seq_len if max_seq_len is None else max_seq_len
        self.tokens: list[int] = []  # committed ids: prompt(s) and generated tokens
        self.target = ModelState.create(engine.target, engine.static_shapes, self.max_seq_len)
        self.draft = (
            ModelState.create(engine.draft, engine.static_shapes, self.max_seq_len)
            if engine.draft is not None
            else None
        )
        self._lock = threading.Lock()

    @property
    def states(self) -> list[ModelState]:
        return [self.target] if self.draft is None else [self.target, self.draft]

    def truncate(self, n_tokens: int) -> None:
        """Cuts the conversation back to its first `n_tokens` committed ids (e.g. after a barge-in)."""
        if not 0 <= n_tokens <= len(self.tokens):
            raise ValueError(f"cannot truncate to {n_tokens} tokens: the conversation has {len(self.tokens)}")
        del self.tokens[n_tokens:]
        for state in self.states:
            state.valid = min(state.valid, n_tokens)

    def fork(self) -> Conversation:
        """A new conversation holding this one's committed ids and their cached keys and values.

        A system prompt shared by many conversations is then prefilled once per process, not once each.
        """
        other = Conversation(self.engine, self.max_seq_len)
        with self._lock:  # not while this one generates
            other.tokens = list(self.tokens)
            for mine, theirs in zip(self.states, other.states, strict=True):
                theirs.cache.copy_prefix_from(mine.cache, mine.valid)  # type: ignore[arg-type]
                theirs.valid = mine.valid
        return other

    def prefill(self, prompt_ids: Sequence[int], *, draft_only: bool = False) -> int:
        """Caches the keys of `prompt_ids` (all but the last id) ahead of a `generate` that will start
        with them, e.g. the words a user has said so far. Returns how many ids were cached already.

        `draft_only`: the draft's forward costs grow with the number of ids (compute-bound on a CPU), the
        target's barely do for a few dozen (memory-bound), so ahead of time it pays to feed the draft only;
        the target takes the ids with its first verification.
        """
        prompt = self.engine.check_prompt(prompt_ids, self.max_seq_len)
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this conversation is generating; prefill it before or after")
        try:
            cached = self.reuse_prefix(prompt)
            for state in self.states[1:] if draft_only else self.states:
                _prefill_state(state, self.tokens)
            return cached
        finally:
            self._lock.release()

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        gamma: int | str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[CommittedBlock]:
        """Streams committed blocks continuing `prompt_ids` (the whole conversation so far, as ids).

        `gamma`: drafted tokens per block, or "auto" for an adaptive length (default: the engine's);
        ignored without a draft model.
        `cancel` is checked between blocks, between drafted tokens and before verifying: once set, the
        stream ends with a 'cancelled' block (a cancelled block costs at most one draft step more).
        """
        params = params or SamplingParams()
        requested = self.engine.gamma if gamma is None else gamma
        draft_length = DraftLength.parse(requested, self.engine.speculation)  # validates it
        if self.draft is None:
            draft_length = DraftLength(0, self.engine.speculation)
        prompt = self.engine.check_prompt(prompt_ids, self.max_seq_len)  # errors surface here, at once
        return self._stream(prompt, params, draft_length, cancel)

    def _stream(
        self,
        prompt: list[int],
        params: SamplingParams,
        draft_length: DraftLength,
        cancel: threading.Event | None,
    ) -> Iterator[CommittedBlock]:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this conversation is already generating; use one conversation per stream")
        try:
            yield from _Generation(self, prompt, params, draft_length, cancel).run()
        finally:
            self._lock.release()

    def reuse_prefix(self, prompt: list[int]) -> int:
        """Makes `prompt` the committed ids, keeping cached keys of the shared prefix; returns its length."""
        shared = 0
        for old, new in zip(self.tokens, prompt, strict=False):
            if old != new:
                break
            shared += 1
        self.tokens = list(prompt)
        for state in self.states:
            # The last prompt id is always fed again: its logits start the first block.
            state.valid = min(state.valid, shared, len(prompt) - 1)
        return self.target.valid


class _Generation:
    """One call of `Conversation.generate`: prefill, then draft/verify/commit blocks."""

    def __init__(
        self,
        conv: Conversation,
        prompt: list[int],
        params: SamplingParams,
        draft_length: DraftLength,
        cancel: threading.Event | None,
    ) -> None:
        self.conv, self.params, self.draft_length, self.cancel = conv, params, draft_length, cancel
        self.engine = conv.engine
        self.clock = self.engine.clock
        self.prompt = prompt
        self.text = TextStream(self.engine.tokenizer, params.stop)
        self.generator = torch.Generator(device=self.engine.target.device)
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)
        self.stats = GenerationStats(
            n_prompt_tokens=len(prompt), accepted_per_position=[0] * draft_length.max_gamma
        )

    def run(self) -> Iterator[CommittedBlock]:
        started = self.clock()
        if self.draft_length.adaptive and not self.engine.speculation.calibrated:
            self.engine.calibrate()  # once per engine (load_engine does it at load for gamma "auto")
        self.stats.n_cached_prompt_tokens = self.conv.reuse_prefix(self.prompt)
        # The target's last prompt ids go with its first verification: one forward fewer. The draft gains
        # nothing so (its cost grows with the ids), and its prefill would then be timed as drafting.
        for state in self.conv.states:
            if not self._cancelled():
                leave = FUSED_PREFILL if state is self.conv.target else 1
                _prefill_state(state, self.conv.tokens, leave=leave)
        self.stats.prefill_s = self.clock() - started
        while True:
            step = None if self._cancelled() else self._step()
            if step is None:
                yield self._finish(self._empty_block(), "cancelled", started)
                return
            block, finish_reason = step
            if self.stats.n_blocks == 1:
                self.stats.ttft_s = self.clock() - started
            if finish_reason is not None:
                yield self._finish(block, finish_reason, started)
                return
            yield block

    def _cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def _step(self) -> tuple[CommittedBlock, str | None] | None:
        """Drafts, verifies and commits one block; returns it and the finish reason, if any (None: the
        generation was cancelled while drafting, and nothing was committed)."""
        tokens = self.conv.tokens
        n_before = len(tokens)
        remaining = self.params.max_new_tokens - self.stats.n_generated
        cache_room = self.conv.max_seq_len - n_before  # verify writes positions n_before-1 .. +gamma
        limit = max(0, min(remaining - 1, cache_room))
        t0 = self.clock()
        draft_tokens, draft_probs = self._propose(limit)
        if self._cancelled():
            return None
        gamma = draft_tokens.shape[0]
        n_rows = n_before - self.conv.target.valid + gamma  # pending ids (1, 2, or a prompt's tail) + drafts
        t1 = self.clock()
        verdict = self._verify(draft_tokens, draft_probs)
        t2 = self.clock()
        committed = [*draft_tokens.tolist()[: verdict.n_accepted], verdict.next_token]
        self._commit(committed, verdict, gamma)
        committed, finish_reason = self._apply_limits(committed, n_before)
        text = self.text.push(committed, final=finish_reason is not None)
        if self.text.stopped:
            finish_reason = "stop"
        self.stats.record_block(gamma, verdict.n_accepted, len(committed), t1 - t0, t2 - t1)
        self.engine.speculation.record(gamma, verdict.n_accepted, t1 - t0, t2 - t1, n_rows)
        timing = BlockTiming(draft_s=t1 - t0, verify_s=t2 - t1, committed_at=self.clock())
        block = CommittedBlock(tuple(committed), text, gamma, verdict.n_accepted, n_before, timing)
        return block, finish_reason

    def _propose(self, limit: int) -> tuple[Tensor, Tensor | None]:
        """Runs the draft while the draft length says so (at most `limit` tokens).

        Returns the drafted ids [G] and, when sampling, their probabilities q [G, V].
        """
        device = self.engine.target.device
        drafted: list[Tensor] = []
        probs: list[Tensor] = []
        draft = self.conv.draft
        confidence = 1.0  # the draft's own probability that everything drafted so far is accepted
        while (
            draft is not None
            and not self._cancelled()
            and self.draft_length.should_draft(len(drafted), confidence, limit)
        ):
            tokens = self.conv.tokens
            if drafted:
                logits = draft.feed(drafted[-1], len(tokens) + len(drafted) - 1, "last")
            else:  # catch up on committed ids the draft has not seen (1, or 2 after a fully accepted block)
                logits = draft.feed(tokens[draft.valid :], draft.valid, "last")
            assert logits is not None  # [1, V]
            if self.params.greedy:
                token = logits.argmax(dim=-1)
                token_prob = logits.softmax(dim=-1)[0, token] if self.draft_length.adaptive else None
            else:
                q = warp_probs(logits, self.params)  # [1, V]
                token = sample(q, self.generator)
                probs.append(q)
                token_prob = q[0, token]
            drafted.append(token)
            if token_prob is not None:
                confidence *= float(token_prob)
        if not drafted:
            return torch.empty(0, dtype=torch.long, device=device), None
        return torch.cat(drafted), (torch.cat(probs) if probs else None)

    def _verify(self, draft_tokens: Tensor, draft_probs: Tensor | None) -> Verdict:
        target = self.conv.target
        tokens = self.conv.tokens
        pending = torch.tensor(tokens[target.valid :], dtype=torch.long, device=draft_tokens.device)
        n_logits = draft_tokens.shape[0] + 1
        # Usually one pending id (two after a fully accepted block); the prompt's tail on the first block.
        mode: LogitsMode | int = "all" if pending.shape[0] <= 2 else n_logits
        logits = target.feed(torch.cat([pending, draft_tokens]), target.valid, mode)
        assert logits is not None
        logits = logits[-n_logits:]  # [G+1, V]
        if self.params.greedy:
            return verify_greedy(draft_tokens, logits)
        p = warp_probs(logits, self.params)
        if draft_probs is None:
            return Verdict(0, int(sample(p, self.generator).item()))
        return verify_sampled(draft_tokens, draft_probs, p, self.generator)

    def _commit(self, committed: list[int], verdict: Verdict, gamma: int) -> None:
        n_before = len(self.conv.tokens)
        self.conv.tokens.extend(committed)
        # The target was fed the last committed id and every draft; the accepted ones are now committed.
        self.conv.target.valid = n_before + verdict.n_accepted
        if self.conv.draft is not None and gamma > 0:
            # The draft was fed the committed ids and drafts 1..gamma-1 (never its last draft).
            self.conv.draft.valid = n_before + min(verdict.n_accepted, gamma - 1)

    def _apply_limits(self, committed: list[int], n_before: int) -> tuple[list[int], str | None]:
        """Cuts the block at an EOS or the token budget; returns the kept ids and a finish reason."""
        finish_reason = None
        if not self.params.ignore_eos:
            for i, token in enumerate(committed):
                if token in self.engine.eos_ids:
                    committed, finish_reason = committed[: i + 1], "stop"
                    break
        remaining = self.params.max_new_tokens - self.stats.n_generated
        if finish_reason is None and len(committed) >= remaining:
            committed, finish_reason = committed[:remaining], "length"
        if finish_reason is None and n_before + len(committed) >= self.conv.max_seq_len:
            finish_reason = "length"  # the KV cache is full
        if n_before + len(committed) < len(self.conv.tokens):
            self.conv.truncate(n_before + len(committed))
        return committed, finish_reason

    def _empty_block(self) -> CommittedBlock:
        timing = BlockTiming(draft_s=0.0, verify_s=0.0, committed_at=self.clock())
        return CommittedBlock((), "", 0, 0, len(self.conv.tokens), timing)

    def _finish(self, block: CommittedBlock, reason: str, started: float) -> CommittedBlock:
        self.stats.total_s = self.clock() - started
        self.stats.finish_reason = reason
        stats = self.stats.snapshot()
        self.engine.metrics.add(stats)
        return CommittedBlock(
            block.token_ids,
            block.text,
            block.n_drafted,
            block.n_accepted,
            block.position,
            block.timing,
            finish_reason=reason,
            stats=stats,
        )


class Engine:
    """A target model, an optional draft sharing its vocabulary, a tokenizer, and a default conversation."""

    def __init__(
        self,
        target: Model,
        draft: Model | None,
        tokenizer: Tokenizer,
        *,
        eos_ids: Iterable[int] = (),
        gamma: int | str = 4,
        static_shapes: bool = False,
        clock: Clock = time.perf_counter,
    ) -> None:
        if draft is not None and draft.args.vocab_size != target.args.vocab_size:
            raise ValueError(
                f"the draft's vocabulary ({draft.args.vocab_size} ids) differs from the target's "
                f"({target.args.vocab_size}); speculative decoding needs a draft with the same tokenizer"
            )
        if draft is not None and draft.max_seq_len != target.max_seq_len:
            raise ValueError("target and draft must be built with the same max_seq_len")
        self.speculation = SpeculationStats()  # measured costs and acceptance, for gamma="auto"
        DraftLength.parse(gamma, self.speculation)  # validates
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.eos_ids = frozenset(eos_ids)
        self.gamma = gamma
        # Decode steps through fixed-shape forwards: captured as CUDA graphs on a GPU (eager elsewhere).
        self.static_shapes = static_shapes
        self.clock = clock
        self.max_seq_len = target.max_seq_len
        self.metrics = EngineMetrics()
        # Held while any conversation makes a block (batch 1): the server's worker and every LocalLLM on
        # this engine step under it, first come first served.
        self.lock = FairLock()
        self._default: Conversation | None = None

    def calibrate(self) -> None:
        """Times target forwards of the sizes the adaptive draft length chooses among, and a draft step,
        on scratch caches; the adaptive policy starts from these figures (engine/calibration.py)."""
        from engine.calibration import measure_costs

        if self.draft is None:
            self.speculation.calibrated = True
            return
        with torch.inference_mode():
            verify_s, draft_step_s = measure_costs(self.target, self.draft, self.clock)
        self.speculation.calibrate(verify_s, draft_step_s)

    def new_conversation(self, max_seq_len: int | None = None) -> Conversation:
        return Conversation(self, max_seq_len)

    @property
    def conversation(self) -> Conversation:
        """The default conversation, created on first use."""
        if self._default is None:
            self._default = self.new_conversation()
        return self._default

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        gamma: int | str | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[CommittedBlock]:
        """`Conversation.generate` on the default conversation."""
        return self.conversation.generate(prompt_ids, params, gamma=gamma, cancel=cancel)

    def check_prompt(self, prompt_ids: Sequence[int], max_seq_len: int | None = None) -> list[int]:
        max_seq_len = self.max_seq_len if max_seq_len is None else max_seq_len
        prompt = list(prompt_ids)
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.target.args.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt ids must be integers in [0, {vocab})")
        if len(prompt) >= max_seq_len:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the KV cache holds {max_seq_len}; "
                "shorten the prompt or raise max_seq_len"
            )
        return prompt


def _prefill_state(state: ModelState, tokens: list[int], leave: int = 1) -> None:
    """Feeds the ids the state has not cached yet, all but the last `leave` (>= 1: the last id's logits
    start the first block, which may as well carry a few more ids than that)."""
    end = len(tokens) - leave
    for start in range(state.valid, end, PREFILL_CHUNK):
        state.feed(tokens[start : min(end, start + PREFILL_CHUNK)], start, "none")
    state.valid = max(state.valid, end)
