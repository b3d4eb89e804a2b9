"""One call of `Conversation.generate`: prefill, then draft / verify / commit blocks until a limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from engine import ngram
from engine.adaptive import DraftLength
from engine.detokenize import TextStream
from engine.metrics import BlockTiming, GenerationStats
from engine.model import LogitsMode
from engine.proposal import Proposal
from engine.sampling import SamplingParams, sample, warp_probs
from engine.speculative import Verdict, verify_greedy, verify_sampled
from engine.state import FUSED_PREFILL, CommittedBlock, prefill_state

# At most this many committed ids the draft has not seen (besides the last) are fed in the same forward as
# the last, which gives the block's first drafted token: one forward instead of two. On a CPU a forward of
# 2-3 ids costs 16-22% more than one of one id (the 1.5B target, 2026-12-06), a second forward 100%. The
# usual case: one id, the drafted token the draft never fed, after a fully accepted block. More (after
# plain blocks) are chunked and timed apart as a catch-up, which the draft length weighs (adaptive.py).
MERGED_CATCH_UP = 2
# The prompt's last ids the draft has not cached (up to this many: a voice reply's last word or two, its mark
# and the chat template's end of turn and assistant header, ~6-8) are fed with its first forward of a
# generation, which gives the first drafted token. The 0.5B draft here (2026-12-07, the Xeon of the results):
# a forward of 7 ids 17.2 ms, of 6 then 1 id 16.5 + 12.6 ms. Not with static forwards (CUDA graphs): each
# tail length would be a shape of its own to capture, and a GPU's draft steps cost little anyway.
MERGED_FIRST_TAIL = 16

if TYPE_CHECKING:
    from engine.generate import Conversation


class Generation:
    """One call of `Conversation.generate`: prefill, then draft/verify/commit blocks."""

    def __init__(
        self,
        conv: Conversation,
        prompt: list[int],
        params: SamplingParams,
        draft_length: DraftLength,
        cancel: threading.Event | None,
        proposal: Proposal | None = None,
        plain_tokens: int = 0,
    ) -> None:
        self.conv, self.params, self.draft_length, self.cancel = conv, params, draft_length, cancel
        self.proposal, self.plain_tokens = proposal, plain_tokens
        self._from_proposal = False  # this block verifies proposed ids, not the draft's
        self.engine = conv.engine
        self.clock = self.engine.clock
        self.prompt = prompt
        self.text = TextStream(self.engine.tokenizer, params.stop)
        self._catch_up_s = 0.0  # this block's draft catch-up on committed ids (not drafting)
        self._caught_up = 0  # ... and how many ids it fed
        self._held_draft = 0  # 1 if its first drafted token came from held logits (no draft forward)
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
        # The target's last prompt ids go with its first verification, the draft's with its first forward
        # (MERGED_FIRST_TAIL): one forward fewer each. A draft that will not run (drafting cannot pay on
        # this machine's costs) is not fed at all: should a probe run it, it catches up then.
        proposing = self.proposal is not None and bool(self.proposal.ids)
        drafts_first = self.draft_length.may_draft() and not proposing and not self._first_block_plain()
        states = self.conv.states if drafts_first else [self.conv.target]
        for state in states:
            if not self._cancelled():
                leave = FUSED_PREFILL if state is self.conv.target else self._draft_first_tail()
                prefill_state(state, self.conv.tokens, leave=leave)
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

    def _draft_first_tail(self) -> int:
        """How many of the prompt's last ids the draft's first forward carries (MERGED_FIRST_TAIL)."""
        draft = self.conv.draft
        return MERGED_FIRST_TAIL if draft is not None and draft.static is None else 1

    def _first_block_plain(self) -> bool:
        """The first block of an adaptive generation does not draft where forwards grow with their ids
        (compute-bound: a CPU). Its verify already carries the prompt's tail, the draft would have to be fed
        that tail first, and each drafted row costs a row more: the first token, which a voice reply waits
        for, would come later for at most a token or two gained (AMD EPYC AVX2: 500-900 ms instead of
        ~400 when it drafted 2)."""
        return self.draft_length.adaptive and self.engine.speculation.forwards_grow_with_ids()

    def _plain_now(self) -> bool:
        """The block is a plain step: the first block, or one within the first `plain_tokens` tokens
        (Conversation.generate), of an adaptive generation where forwards grow with their ids."""
        within = self.stats.n_blocks == 0 or self.stats.n_generated < self.plain_tokens
        return within and self._first_block_plain()

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
        t0, work0 = self.clock(), self.engine.work_clock()
        draft_tokens, draft_probs = self._propose(limit)
        if self._cancelled():
            return None
        gamma = draft_tokens.shape[0]
        n_rows = n_before - self.conv.target.valid + gamma  # pending ids (1, 2, or a prompt's tail) + drafts
        t1, work1 = self.clock(), self.engine.work_clock()
        # What the drafted tokens cost: not the catch-up, nor the time forwards were held for speech jobs
        drafting_s = work1 - work0 - self._catch_up_s
        verdict = self._verify(draft_tokens, draft_probs)
        t2 = self.clock()
        verifying_s = self.engine.work_clock() - work1
        committed = [*draft_tokens.tolist()[: verdict.n_accepted], verdict.next_token]
        self._commit(committed, verdict, gamma)
        committed, finish_reason = self._apply_limits(committed, n_before)
        text = self.text.push(committed, final=finish_reason is not None)
        if self.text.stopped:
            finish_reason = "stop"
        self._record(
            gamma, verdict.n_accepted, len(committed), (t1 - t0, drafting_s, t2 - t1, verifying_s), n_rows
        )
        timing = BlockTiming(draft_s=t1 - t0, verify_s=t2 - t1, committed_at=self.clock())
        block = CommittedBlock(tuple(committed), text, gamma, verdict.n_accepted, n_before, timing)
        return block, finish_reason

    def _record(
        self,
        gamma: int,
        n_accepted: int,
        n_committed: int,
        seconds: tuple[float, float, float, float],
        n_rows: int,
    ) -> None:
        """The block's figures; `seconds`: (draft step, what its drafted tokens cost, verify, what the verify
        cost): the costs, which the adaptive draft length learns, leave out the time forwards were held
        (`Engine.pause_between_layers`); the block's own figures are wall time."""
        draft_s, drafting_s, verify_s, verifying_s = seconds
        if n_rows == 0:  # its token came from held logits: no forward to learn a cost from
            self.stats.record_block(gamma, n_accepted, n_committed, draft_s, verify_s)
            return
        if self._from_proposal:  # not the draft's work: only the verify's cost by rows is learnt
            assert self.proposal is not None
            self.proposal.follow(self.conv.tokens[len(self.prompt) :])
            self.stats.n_proposed, self.stats.n_proposal_kept = self.proposal.n_proposed, self.proposal.n_kept
            self.stats.record_block(0, 0, n_committed, draft_s, verify_s)
            self.engine.speculation.record(0, 0, 0.0, verifying_s, n_rows)
            return
        self.stats.record_block(gamma, n_accepted, n_committed, draft_s, verify_s)
        self.draft_length.record(
            gamma,
            n_accepted,
            drafting_s,
            verifying_s,
            n_rows,
            catch_up_s=self._catch_up_s,
            n_caught_up=self._caught_up,
            n_draft_forwards=gamma - self._held_draft,
        )

    def _propose(self, limit: int) -> tuple[Tensor, Tensor | None]:
        """Runs the draft while the draft length says so (at most `limit` tokens), or takes the next ids
        of the caller's proposal while the output still follows it.

        Returns the drafted ids [G] and, when sampling, their probabilities q [G, V].
        """
        device = self.engine.target.device
        self._catch_up_s, self._caught_up, self._held_draft = 0.0, 0, 0
        self._from_proposal = False
        if self.proposal is not None:
            n_pending = len(self.conv.tokens) - self.conv.target.valid
            n_generated = len(self.conv.tokens) - len(self.prompt)
            ids = self.proposal.take(n_generated, n_pending, limit, self.engine.speculation)
            if ids:
                self._from_proposal = True
                return self._certain(ids)
        if self.engine.ngram_drafts:
            return self._propose_ngram(limit)
        if self._plain_now():
            return torch.empty(0, dtype=torch.long, device=device), None
        drafted: list[Tensor] = []
        probs: list[Tensor] = []
        draft = self.conv.draft
        confidence = 1.0  # the draft's own probability that everything drafted so far is accepted
        unseen = 0 if draft is None else max(0, len(self.conv.tokens) - 1 - draft.valid)
        while (
            draft is not None
            and not self._cancelled()
            and self.draft_length.should_draft(len(drafted), confidence, limit, catch_up_ids=unseen)
        ):
            tokens = self.conv.tokens
            if drafted:
                logits = draft.feed(drafted[-1], len(tokens) + len(drafted) - 1, "last")
            elif draft.valid == len(tokens):  # a forward that ended at the committed ids left their logits
                logits, self._held_draft = draft.take_next_logits(), 1
            else:  # catch up on committed ids the draft has not seen (1, or 2 after a fully accepted block;
                # the prompt's tail in a generation's first block; more after plain blocks, which do not run
                # the draft)
                first = self.stats.n_blocks == 0
                merged = max(MERGED_CATCH_UP, self._draft_first_tail() - 1) if first else MERGED_CATCH_UP
                if unseen > merged:  # a long one, chunked and timed apart: not drafting
                    started = self.engine.work_clock()
                    prefill_state(draft, tokens)  # feeds the `unseen` ids (all but the last)
                    self._catch_up_s, self._caught_up = self.engine.work_clock() - started, unseen
                started = self.engine.work_clock()
                logits = draft.feed(tokens[draft.valid :], draft.valid, "last")
                if unseen <= merged:  # they rode along: their rows' share of the forward
                    self._catch_up_s = self._rows_share(unseen, self.engine.work_clock() - started)
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

    def _rows_share(self, unseen: int, forward_s: float) -> float:
        """What `unseen` committed ids fed in a draft forward of `forward_s` cost (not drafting): one or two
        at the measured cost an id; a prompt's tail, what the forward took over a draft step."""
        speculation = self.engine.speculation
        if unseen <= MERGED_CATCH_UP:
            return unseen * (speculation.catch_up_id_s.value or 0.0)
        step = speculation.draft_step_s()
        return max(0.0, forward_s - step) if step is not None else 0.0

    def _propose_ngram(self, limit: int) -> tuple[Tensor, Tensor | None]:
        """Prompt-lookup drafts (engine/ngram.py), as many as the draft length takes: [G], and when
        sampling their draft distributions q [G, V], one-hot (the proposal is certain)."""
        candidates = ngram.propose(self.conv.tokens, min(limit, self.draft_length.max_gamma))
        n = 0
        while n < len(candidates) and self.draft_length.should_draft(n, 1.0, limit):
            n += 1
        return self._certain(candidates[:n])

    def _certain(self, ids: list[int]) -> tuple[Tensor, Tensor | None]:
        """Proposed ids as drafts [G] and, when sampling, one-hot draft distributions q [G, V]."""
        device = self.engine.target.device
        n = len(ids)
        drafted = torch.tensor(ids, dtype=torch.long, device=device)
        if self.params.greedy or n == 0:
            return drafted, None
        q = torch.zeros(n, self.engine.target.args.vocab_size, device=device)
        q[torch.arange(n, device=device), drafted] = 1.0
        return drafted, q

    def _verify(self, draft_tokens: Tensor, draft_probs: Tensor | None) -> Verdict:
        logits = self._target_logits(draft_tokens)  # [G+1, V]
        if self.params.greedy:
            return verify_greedy(draft_tokens, logits)
        p = warp_probs(logits, self.params)
        if draft_probs is None:
            return Verdict(0, int(sample(p, self.generator).item()))
        return verify_sampled(draft_tokens, draft_probs, p, self.generator)

    def _target_logits(self, draft_tokens: Tensor) -> Tensor:
        """The target's logits after the committed ids and after each drafted one: [G+1, V]."""
        target = self.conv.target
        tokens = self.conv.tokens
        if target.valid == len(tokens):  # a forward that ended at the committed ids left their logits
            held = target.take_next_logits()  # [1, V]
            if draft_tokens.shape[0] == 0:
                return held
            later = target.feed(draft_tokens, target.valid, "all")
            assert later is not None
            return torch.cat([held.to(later.dtype), later])
        pending = torch.tensor(tokens[target.valid :], dtype=torch.long, device=draft_tokens.device)
        n_logits = draft_tokens.shape[0] + 1
        # Usually one pending id (two after a fully accepted block); the prompt's tail on the first block.
        mode: LogitsMode | int = "all" if pending.shape[0] <= 2 else n_logits
        logits = target.feed(torch.cat([pending, draft_tokens]), target.valid, mode)
        assert logits is not None
        return logits[-n_logits:]

    def _commit(self, committed: list[int], verdict: Verdict, gamma: int) -> None:
        n_before = len(self.conv.tokens)
        self.conv.tokens.extend(committed)
        # The target was fed the last committed id and every draft; the accepted ones are now committed.
        self.conv.target.valid = n_before + verdict.n_accepted
        if self.conv.draft is not None and gamma > 0 and not self._from_proposal:
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
