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

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from engine import turn_end
from engine.adaptive import DraftLength, SpeculationStats
from engine.calibration import measure_costs
from engine.detokenize import Tokenizer
from engine.engine_thread import ENGINE_THREAD, on_engine_thread
from engine.fair_lock import FairLock
from engine.generation import Generation
from engine.metrics import EngineMetrics
from engine.model import Transformer
from engine.proposal import Proposal
from engine.sampling import SamplingParams
from engine.state import (  # re-exported: the engine's types and its prefill schedule
    FUSED_PREFILL,
    PREFILL_CHUNK,
    Clock,
    CommittedBlock,
    Model,
    ModelState,
    prefill_state,
    shared_prefix_length,
)
from engine.turn_head import TurnHead

__all__ = [
    "FUSED_PREFILL",
    "PREFILL_CHUNK",
    "Clock",
    "CommittedBlock",
    "Conversation",
    "Engine",
    "Model",
    "ModelState",
    "prefill_state",
]


# The target is fed the user's words while they speak where a forward of 9 ids costs over this many one-id
# steps: then each id it takes ahead is one the reply's first verify need not carry (~5 ms an id on 2
# AVX-512 cores, a 9-id forward 1.7-1.85x a step). The session holds those forwards between layers while a
# partial transcript decodes (voiceagent/cpu_lane.py), so feeding them does not delay the partials.
# `python -m voiceagent bench`, 2026-12-07, against the target left out (2x): the reply's start to its
# first committed block 167-218 against 238-240 ms p50, 291-347 against 328-359 ms after the end of speech
# (bench/results/2026-12-07-cpu-xeon-amx-167-feed-ahead.md).
FEED_AHEAD_GROWTH = 1.25


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
            state.next_logits = None

    @on_engine_thread
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

    @on_engine_thread
    def prefill(self, prompt_ids: Sequence[int], *, draft_only: bool = False) -> int:
        """Caches the keys of `prompt_ids` (all but the last id) ahead of a `generate` that will start
        with them, e.g. the words a user has said so far. Returns how many ids were cached already.

        `draft_only`: on a GPU the target's forward costs barely grow for a few dozen ids (memory-bound),
        so ahead of time it pays to feed the draft only, and the target takes the ids with its first
        verification. Where the target's forwards grow with the ids (`feeds_target_ahead`: every CPU
        measured here) or there is no draft, the target is fed too.
        """
        prompt = self.engine.check_prompt(prompt_ids, self.max_seq_len)
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this conversation is generating; prefill it before or after")
        try:
            cached = self.reuse_prefix(prompt)
            ahead = self.states[1:] if draft_only and not self.feeds_target_ahead() else self.states
            for state in ahead:
                prefill_state(state, self.tokens)
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
        proposal: Sequence[int] = (),
        plain_tokens: int = 0,
    ) -> Iterator[CommittedBlock]:
        """Streams committed blocks continuing `prompt_ids` (the whole conversation so far, as ids).

        `gamma`: drafted tokens per block, or "auto" for an adaptive length (default: the engine's);
        ignored without a draft model.
        `cancel` is checked between blocks, between drafted tokens and before verifying: once set, the
        stream ends with a 'cancelled' block (a cancelled block costs at most one draft step more).
        `proposal`: ids the caller expects the reply to begin with (e.g. the reply it had started to a
        slightly different prompt); the first blocks verify them as drafts (engine/proposal.py). The
        output is the same with or without one; only its speed differs.
        `plain_tokens`: with an adaptive gamma, the first this many tokens come from plain steps where a
        forward's cost grows with its ids (a CPU): each token then arrives as soon as it is computed, which
        a listener waiting for a reply's first phrase needs more than throughput (a drafted block's tokens
        all arrive at its end). On a GPU, where a verify costs about a step, drafting goes on.
        """
        if plain_tokens < 0:
            raise ValueError(f"plain_tokens must be >= 0, got {plain_tokens}")
        params = params or SamplingParams()
        requested = self.engine.gamma if gamma is None else gamma
        draft_length = DraftLength.parse(requested, self.engine.speculation)  # validates it
        if self.draft is None and not self.engine.ngram_drafts:
            draft_length = DraftLength(0, self.engine.speculation)
        prompt = self.engine.check_prompt(prompt_ids, self.max_seq_len)  # errors surface here, at once
        vocab = self.engine.target.args.vocab_size
        if any(not 0 <= int(i) < vocab for i in proposal):
            raise ValueError(f"a proposed id is outside the vocabulary [0, {vocab})")
        proposed = Proposal(proposal) if proposal else None
        blocks = self._stream(prompt, params, draft_length, cancel, proposed, plain_tokens)
        return ENGINE_THREAD.iterate(blocks)  # each block computed on the engine thread, whoever iterates

    def _stream(
        self,
        prompt: list[int],
        params: SamplingParams,
        draft_length: DraftLength,
        cancel: threading.Event | None,
        proposal: Proposal | None = None,
        plain_tokens: int = 0,
    ) -> Iterator[CommittedBlock]:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this conversation is already generating; use one conversation per stream")
        try:
            yield from Generation(self, prompt, params, draft_length, cancel, proposal, plain_tokens).run()
        finally:
            self._lock.release()

    @on_engine_thread
    def end_of_turn_probability(
        self,
        prompt_ids: Sequence[int],
        *,
        after_mark_power: float = turn_end.AFTER_MARK_POWER,
        model: turn_end.ScoreModel = "draft",
        learned: bool = False,
        reply_prompt: Sequence[int] | None = None,
    ) -> float | None:
        """P(the user's message is complete) after `prompt_ids`: the chat prompt up to and including the
        user's words so far, cut before the id that would close their message (engine/turn_end.py).

        `model`: which model's cache scores (turn_end's docstring has what each costs and separates):
        "draft" (the target's where there is no draft), "target", or "auto": the target where `prefill`
        feeds it ahead (a compute-bound CPU, or no draft), so the ids it feeds are the reply's own
        prefill, else the draft. The words stay cached for the reply,
        nothing fed past them is kept. None while the conversation generates (never waits for it).
        `after_mark_power`: how much what follows a punctuation mark counts (turn_end's docstring).
        `learned`: the scoring model's trained end-of-turn head (engine/turn_head.py; `Engine.turn_heads`)
        gives the score where it has one; False (the default): the model's own score.
        `reply_prompt`: the prompt of the reply that will be asked for next (these words, their marks and
        the assistant's header). Where the scoring model's forwards are eager (a CPU), the score's forward
        carries it too, and a generation of exactly that prompt starts from that forward's last row: the
        draft's first drafted token (or the target's first token) without a forward of its own
        (turn_end's docstring).
        """
        if model not in turn_end.SCORE_MODELS:
            raise ValueError(f"the end-of-turn model is one of {turn_end.SCORE_MODELS}, got {model!r}")
        words = self.engine.check_prompt(prompt_ids, self.max_seq_len)
        reply = None if reply_prompt is None else self.engine.check_prompt(reply_prompt, self.max_seq_len)
        marks = turn_end.turn_marks(self.engine.tokenizer)
        on_target = model == "target" or (model == "auto" and self.feeds_target_ahead())
        if not self._lock.acquire(blocking=False):
            return None
        try:
            scorer = "target" if on_target or self.draft is None else "draft"
            head = self.engine.turn_heads.get(scorer) if learned else None
            return turn_end.end_of_turn_probability(
                self, words, marks, after_mark_power, on_target=on_target, head=head, reply=reply
            )
        finally:
            self._lock.release()

    def feeds_target_ahead(self) -> bool:
        """Whether `prefill(..., draft_only=True)` feeds the target too: no draft, or a target whose
        forwards grow with the ids by over FEED_AHEAD_GROWTH (every CPU measured here, not a GPU)."""
        return self.draft is None or self.engine.speculation.forwards_grow_with_ids(FEED_AHEAD_GROWTH)

    def reuse_prefix(self, prompt: list[int]) -> int:
        """Makes `prompt` the committed ids, keeping cached keys of the shared prefix; returns its length."""
        shared = shared_prefix_length(self.tokens, prompt)
        same = shared == len(self.tokens) == len(prompt)
        self.tokens = list(prompt)
        for state in self.states:
            # The last prompt id is fed again (its logits start the first block) unless they are held.
            held = same and state.next_logits is not None and state.valid == len(prompt)
            if not held:
                state.next_logits = None
            state.valid = min(state.valid, shared, len(prompt) if held else len(prompt) - 1)
        return self.target.valid

    def hold_next_logits(self, state: ModelState, prompt: list[int], logits: Tensor) -> None:
        """Makes `prompt` the committed ids, with `state` fed all of them and `logits` ([1, V]) its logits
        after the last (`ModelState.next_logits`): a generation of `prompt` starts from them."""
        self.tokens = list(prompt)
        state.valid = len(prompt)
        state.next_logits = logits


NGRAM_STEP_S = 1e-5  # what a prompt-lookup proposal costs, for the adaptive length (no forward)


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
        ngram_drafts: bool = False,
    ) -> None:
        """`ngram_drafts`: draft by prompt lookup (engine/ngram.py) instead of a draft model (give none)."""
        if ngram_drafts and draft is not None:
            raise ValueError("n-gram drafts replace the draft model: give draft=None with ngram_drafts")
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
        self.ngram_drafts = ngram_drafts
        # Decode steps through fixed-shape forwards: captured as CUDA graphs on a GPU (eager elsewhere).
        self.static_shapes = static_shapes
        self.clock = clock
        self.max_seq_len = target.max_seq_len
        self.metrics = EngineMetrics()
        # Held while a thread steps a conversation's block (batch 1): the server's worker steps under it,
        # first come first served (engine/fair_lock.py; LocalLLMs queue on the engine thread instead).
        self.lock = FairLock()
        self._default: Conversation | None = None
        # Seconds forwards have spent held by the `pause_between_layers` hook (the engine's clock): the
        # costs the adaptive draft length learns leave them out (a forward held while a phrase's audio
        # renders is not a slower forward).
        self.paused_s = 0.0
        # "target" / "draft" -> that model's trained end-of-turn head (engine/turn_head.py), from load_engine
        self.turn_heads: dict[str, TurnHead] = {}

    def pause_between_layers(self, hook: Callable[[], None] | None) -> None:
        """Runs `hook()` between the layers of every forward of the target and the draft (PyTorch models on
        the CPU; llama.cpp's graph runs whole, and a GPU's forwards are captured): a caller sharing the CPU
        with other work may hold a forward there (voiceagent/cpu_lane.py). None: no hook."""
        timed = None if hook is None else functools.partial(self._held, hook)
        for model in (self.target, self.draft):
            if isinstance(model, Transformer) and model.device.type == "cpu":
                model.between_layers = timed

    def _held(self, hook: Callable[[], None]) -> None:
        started = self.clock()
        hook()
        self.paused_s += self.clock() - started

    def work_clock(self) -> float:
        """The engine's clock less the time its forwards were held (`paused_s`): the difference of two
        readings is what the engine computed between them."""
        return self.clock() - self.paused_s

    @on_engine_thread
    def calibrate(self) -> None:
        """Times target forwards of the sizes the adaptive draft length chooses among, and a draft step,
        on scratch caches; the adaptive policy starts from these figures (engine/calibration.py)."""
        if self.draft is None and not self.ngram_drafts:
            self.speculation.calibrated = True
            return
        with torch.inference_mode():
            verify_s, draft_step_s = measure_costs(self.target, self.draft, self.clock)
        self.speculation.calibrate(verify_s, NGRAM_STEP_S if self.ngram_drafts else draft_step_s)

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
