"""A reply started before the user is known to have finished (LiveKit calls this preemptive generation).

Once the user pauses (`SessionOptions.pause_ms` of silence), the session decodes a partial transcript that
hears the whole utterance and starts the LLM on it while the endpointer still waits for its end-of-speech
silence. The committed blocks are kept here, unspoken. At speech_end the final transcript (which reuses that
very partial when nothing was said since) either matches and the reply is adopted, its first block often
ready already, or differs and the reply is cancelled. If the user speaks on, it is cancelled at once.
Committed blocks are what the model would write for that history anyway, so adopting them is exact.

The reply's first phrase is spoken ahead too (`SpeakAhead`): once its blocks make a phrase, TTS renders it
in the background, so a reply adopted after a long endpoint wait starts its audio at once instead of after
the phrase's synthesis. A cancelled reply cancels its rendering.

A cancelled reply is not wasted where the LLM takes proposals (`ProposingLLM`, the in-process engine): the
ids it committed are the likely start of the reply to the changed words ("?" for "."), so the next reply
is given them to verify as one long draft (`proposal_ids`): whatever the target confirms costs one forward
per block instead of one per token, and the reply is the same as without.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from voiceagent.llm import LLM, Message, PrefillingLLM, ProposingLLM, ReplyBlock, ReplyOptions
from voiceagent.stages import ChunkerLike
from voiceagent.trace import (
    LLM_PREEMPTIVE_CANCEL,
    LLM_PREEMPTIVE_START,
    LLM_PREFILL,
    LLM_PROPOSAL_KEPT,
    Trace,
)


def reply_stream(
    llm: LLM, messages: Sequence[Message], options: ReplyOptions, proposal: Sequence[int] = ()
) -> AsyncIterator[ReplyBlock]:
    """The LLM's reply to `messages`, with `proposal` verified as its start where the LLM can."""
    if proposal and isinstance(llm, ProposingLLM):
        return llm.stream_proposed(messages, options, proposal)
    return llm.stream(messages, options)


@dataclass(frozen=True)
class SpeakAhead:
    """How a preemptive reply renders its first phrase before it is adopted: the session's chunker (the
    replier's own, so the phrase is the one the reply will speak) and its TTS at the output rate."""

    new_chunker: Callable[[], ChunkerLike]
    render: Callable[[str], Coroutine[Any, Any, list[np.ndarray]]]  # phrase -> its audio chunks


@dataclass(frozen=True)
class SpokenAhead:
    """A preemptive reply's first phrase and its audio in the making."""

    phrase: str
    audio: asyncio.Task[list[np.ndarray]]


class PreemptiveReply:
    """The LLM's reply to `messages`, streamed in a task of its own into a buffer until adopted."""

    def __init__(
        self,
        llm: LLM,
        messages: Sequence[Message],
        options: ReplyOptions,
        proposal: Sequence[int] = (),
        speak_ahead: SpeakAhead | None = None,
        heard_until_ns: int = 0,
    ) -> None:
        self.messages = [dict(message) for message in messages]
        self.heard_until_ns = heard_until_ns  # the end of the audio its partial heard
        self._given = [int(i) for i in proposal]
        self._own_ids: list[int] = []
        self._arrived: asyncio.Queue[ReplyBlock | Exception | None] = asyncio.Queue()
        self.spoken_ahead: SpokenAhead | None = None
        self._ahead_done = False  # the first phrase is being rendered, or the reply was adopted without it
        self._task = asyncio.create_task(self._run(llm, options, proposal, speak_ahead))

    async def _run(
        self, llm: LLM, options: ReplyOptions, proposal: Sequence[int], speak_ahead: SpeakAhead | None
    ) -> None:
        chunker = speak_ahead.new_chunker() if speak_ahead is not None else None
        try:
            async for block in reply_stream(llm, self.messages, options, proposal):
                self._own_ids.extend(block.token_ids)
                self._arrived.put_nowait(block)
                if chunker is not None and speak_ahead is not None and not self._ahead_done:
                    phrases = chunker.push(block.text)
                    phrases = phrases or (chunker.flush() if block.finish_reason is not None else [])
                    if phrases:
                        audio = asyncio.create_task(speak_ahead.render(phrases[0]))
                        self.spoken_ahead, self._ahead_done = SpokenAhead(phrases[0], audio), True
        except Exception as error:  # handed to whoever adopts the reply
            self._arrived.put_nowait(error)
        finally:
            self._arrived.put_nowait(None)

    @property
    def proposal_ids(self) -> list[int]:
        """The ids this reply has committed so far, or the longer proposal it was given while its own ids
        still follow it: the likely start of a reply to slightly different words."""
        own = self._own_ids
        if len(self._given) > len(own) and self._given[: len(own)] == own:
            return list(self._given)
        return list(own)

    def take_spoken_ahead(self) -> SpokenAhead | None:
        """At adoption: the first phrase's audio in the making, if any; none is started after this (the
        replier speaks the phrase itself)."""
        self._ahead_done = True
        return self.spoken_ahead

    def matches(self, messages: Sequence[Message]) -> bool:
        """True if this reply answers exactly `messages` (the history with the final transcript)."""
        return self.messages == [dict(message) for message in messages]

    async def blocks(self) -> AsyncIterator[ReplyBlock]:
        """The reply's blocks: the buffered ones at once, then the rest as they come; raises its error."""
        while (item := await self._arrived.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    def cancel(self) -> None:
        """Stops the generation (the engine stops at its next block; a remote stream is closed) and the
        rendering of its first phrase."""
        self._task.cancel()
        if self.spoken_ahead is not None:
            self.spoken_ahead.audio.cancel()

    async def stopped(self) -> None:
        """Cancels it and returns once its stream is closed (the engine told to stop)."""
        self.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class Preemption:
    """A session's head starts: its stable words fed to the LLM while the user speaks (`prefill`), and one
    preemptive reply at a time, started on a partial, dropped, or taken at the final."""

    def __init__(
        self,
        llm: LLM,
        options: ReplyOptions,
        trace: Trace,
        prefill_while_speaking: bool,
        speak_ahead: SpeakAhead | None = None,
    ) -> None:
        self.llm, self.options, self.trace = llm, options, trace
        self.prefill_while_speaking, self.speak_ahead = prefill_while_speaking, speak_ahead
        self.reply: PreemptiveReply | None = None
        self._carried: list[int] = []  # the ids of a reply stopped by stop_other, for the next one
        self.prefilling: asyncio.Task[bool] | None = None
        self.prefilled = ""  # the words of this utterance fed last

    def prefill(self, turn: int, messages: Sequence[Message], words: str) -> None:
        """Feeds the user's words so far (`words`, the last message) to the draft model (and on a CPU the
        target) while they speak (see Conversation.prefill), unless none is in flight or they are the
        words fed last or a prefix of them (their ids are cached). Words that differ from a guess fed
        before ("how many days are there in" after "how many days are you going to") are fed: the cache
        keeps the shared prefix, so only the changed words cost a forward."""
        said = words.split()
        if (
            not self.prefill_while_speaking
            or not isinstance(self.llm, PrefillingLLM)
            or said == self.prefilled.split()[: len(said)]
            or (self.prefilling is not None and not self.prefilling.done())
        ):
            return
        self.prefilled = words
        self.prefilling = asyncio.create_task(self.llm.prefill(messages, draft_only=True))
        self.trace.write(LLM_PREFILL, turn, words=len(said))

    async def stop_other(self, turn: int, messages: Sequence[Message]) -> None:
        """Stops a reply to other words than `messages` and waits until its stream is closed, so the LLM
        is free (to score the new words); its ids are kept for the next reply as a proposal."""
        reply = self.reply
        if reply is not None and not reply.matches(messages):
            self._carried = reply.proposal_ids
            self.drop(turn, "the words changed")
            await reply.stopped()

    def start(self, turn: int, messages: Sequence[Message], text: str, heard_until_ns: int) -> None:
        """Starts the reply to `messages` (the history and the partial `text`, which heard the audio up to
        `heard_until_ns`) unless it is running; a reply to other words is cancelled, its ids proposed to
        the new one."""
        if self.reply is not None and self.reply.matches(messages):
            self.reply.heard_until_ns = max(self.reply.heard_until_ns, heard_until_ns)
            return  # the same words: keep the reply that is already running
        proposal = self.reply.proposal_ids if self.reply is not None else self._carried
        self._carried = []
        self.drop(turn, "the words changed")
        self.reply = PreemptiveReply(
            self.llm, messages, self.options, proposal, self.speak_ahead, heard_until_ns
        )
        self.trace.write(LLM_PREEMPTIVE_START, turn, text=text, proposed=len(proposal))

    def heard_all(self, heard_all: Callable[[int], bool]) -> int | None:
        """The end of the audio heard by the partial the running reply started on, if that partial heard
        every word said so far (`heard_all` of it): it stands in for the pause partial. Else None."""
        reply = self.reply
        return reply.heard_until_ns if reply is not None and heard_all(reply.heard_until_ns) else None

    def stream(
        self, turn: int, messages: Sequence[Message], proposal: Sequence[int]
    ) -> AsyncIterator[ReplyBlock]:
        """A new reply to `messages`, verifying `proposal` (a cancelled reply's ids) as its likely start
        where the LLM can, with `llm.proposal_kept` traced."""
        blocks = reply_stream(self.llm, messages, self.options, proposal)
        if proposal and isinstance(self.llm, ProposingLLM):
            blocks = trace_kept(self.trace, turn, blocks, list(proposal))
        return blocks

    def drop(self, turn: int, reason: str) -> None:
        if self.reply is not None:
            self.reply.cancel()
            self.reply = None
            self.trace.write(LLM_PREEMPTIVE_CANCEL, turn, reason=reason)

    def take(self, turn: int, messages: Sequence[Message] | None) -> tuple[PreemptiveReply | None, list[int]]:
        """At the final transcript (`messages` with it; None: no words): the reply if it answers exactly
        these messages, else (None, the cancelled reply's ids as a proposal for the next one)."""
        reply, self.reply = self.reply, None
        carried, self._carried = self._carried, []
        if reply is None:
            return None, carried
        if messages is not None and reply.matches(messages):
            return reply, []
        reply.cancel()
        proposal = reply.proposal_ids
        self.trace.write(
            LLM_PREEMPTIVE_CANCEL, turn, reason="the final transcript differs", proposed=len(proposal)
        )
        return None, proposal


async def trace_kept(
    trace: Trace, turn: int, blocks: AsyncIterator[ReplyBlock], proposal: list[int]
) -> AsyncIterator[ReplyBlock]:
    """Passes the blocks on; writes `llm.proposal_kept` once the reply has confirmed or left the proposal:
    how many of its ids the target wrote again."""
    made: list[int] = []
    written = False
    async for block in blocks:
        made.extend(block.token_ids)
        left = made[: len(proposal)] != proposal[: len(made)]
        if not written and (left or len(made) >= len(proposal) or block.finish_reason is not None):
            kept = next((i for i, (a, b) in enumerate(zip(made, proposal, strict=False)) if a != b), None)
            trace.write(LLM_PROPOSAL_KEPT, turn, proposed=len(proposal),
                        kept=min(len(made), len(proposal)) if kept is None else kept)  # fmt: skip
            written = True
        yield block
