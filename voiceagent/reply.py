"""The agent's half of a turn: committed LLM blocks -> phrase chunker -> TTS audio, as session events.

`Replier.respond` speaks the reply to the user's words from the LLM's stream of committed blocks (fresh,
or adopted from a preemptive reply: the session chooses): each block becomes a `ReplyText`, the chunker
turns blocks into phrases, and TTS speaks each phrase as soon as it exists, in a task of its own, so the
LLM keeps writing while TTS speaks. TTS runs in a worker thread of its own pool, as a speech job of the
CPU lane (voiceagent/cpu_lane.py); a cancelled reply closes its synthesis as soon as the thread lets go.
An adopted preemptive reply may bring its first phrase's audio made ahead (`SpokenAhead`,
voiceagent/preempt.py, rendered by `render`): it is sent at once.

The replier also keeps the spoken-words map: for each turn, which phrases were synthesised and how much of
their audio the transport has played, so a barge-in cuts the history to the words the user heard.
A failing stage raises `ReplyFailed`; the session turns that into the turn's `TurnError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from voiceagent.clock import Clock
from voiceagent.cpu_lane import NO_LANE, CpuLane
from voiceagent.events import Event, ReplyText, SpeechAudio, TurnEnded
from voiceagent.llm import ReplyBlock
from voiceagent.preempt import SpokenAhead
from voiceagent.spoken import SpokenReply
from voiceagent.stages import ChunkerLike, EndpointerLike
from voiceagent.trace import CHUNK_PHRASE, LLM_BLOCK, LLM_FIRST_BLOCK, TTS_FIRST_AUDIO, TURN_END, Trace
from voiceagent.tts import Synthesizer, synthesize_at

if TYPE_CHECKING:
    from voiceagent.session import SessionOptions

_TTS_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="voice-tts")


async def _next_in_thread(chunks: Iterator[np.ndarray], lane: CpuLane) -> np.ndarray | None:
    """The generator's next item, computed in a TTS worker thread, in the CPU lane. If the caller is
    cancelled (barge-in), the generator is closed as soon as the thread lets go of it, which stops a TTS
    subprocess at once."""
    ticket = lane.begin()  # here, not in the thread: the engine's next block waits from now on
    job = _TTS_POOL.submit(lane.next_of, ticket, chunks)
    try:
        return await asyncio.wrap_future(job)
    except asyncio.CancelledError:
        job.add_done_callback(lambda _: chunks.close() if isinstance(chunks, Generator) else None)
        raise


async def _made_ahead(ahead: SpokenAhead | None, phrase: str) -> list[np.ndarray] | None:
    """The audio made ahead if it is of `phrase` and did not fail; else None (and its making stopped)."""
    if ahead is None:
        return None
    if ahead.phrase != phrase or ahead.audio.cancelled():
        ahead.audio.cancel()
        return None
    try:
        return await asyncio.shield(ahead.audio)
    except Exception:  # noqa: BLE001 - synthesised again, now, and a failure then is the turn's
        return None


class ReplyFailed(Exception):
    """A stage of the reply failed: which one ("llm" or "tts"), why, and the `TurnError` code to send."""

    def __init__(self, stage: str, error: Exception, code: str = "turn_failed") -> None:
        super().__init__(f"{stage}: {error}")
        self.stage, self.error, self.code = stage, error, code


class Replier:
    """Makes a session's replies and remembers what of them was heard. `history` is the session's own
    list: a reply adds the user's words and the assistant's, a barge-in cuts the latter to what was heard."""

    def __init__(
        self,
        *,
        synthesizer: Synthesizer,
        new_chunker: Callable[[], ChunkerLike],
        endpointer: EndpointerLike,
        clock: Clock,
        trace: Trace,
        options: SessionOptions,
        history: list[dict[str, str]],
        emit: Callable[[Event], None],
        lane: CpuLane = NO_LANE,
    ) -> None:
        self.synthesizer, self.new_chunker, self.lane = synthesizer, new_chunker, lane
        self.endpointer, self.clock, self.trace, self.options = endpointer, clock, trace, options
        self.history, self.emit = history, emit
        self.spoken: dict[int, SpokenReply] = {}  # turn -> its phrases' audio and the playback position
        self.answered = 0  # the turn whose whole reply is the history's last message

    async def respond(
        self,
        turn: int,
        user_text: str,
        blocks: AsyncIterator[ReplyBlock],
        *,
        preemptive: bool = False,
        ahead: SpokenAhead | None = None,
    ) -> None:
        """Answers `user_text` with `blocks` (the LLM's reply to the history plus `user_text`; `preemptive`
        when it was started before the end of speech, `ahead` its first phrase's audio in the making):
        speaks it and ends the turn with `TurnEnded`.
        Raises ReplyFailed when the LLM or TTS fails or the reply runs over max_turn_s."""
        self.history.append({"role": "user", "content": user_text})
        phrases: asyncio.Queue[str | None] = asyncio.Queue()
        speaker = asyncio.create_task(self._speak(turn, phrases, ahead))
        reply, stage = "", "llm"
        limit = asyncio.timeout(self.options.max_turn_s)
        try:
            async with limit:
                chunker = self.new_chunker()
                async for block in blocks:
                    self._on_block(turn, block, first=not reply, preemptive=preemptive)
                    reply += block.text
                    for phrase in chunker.push(block.text):
                        phrases.put_nowait(phrase)
                for phrase in chunker.flush():
                    phrases.put_nowait(phrase)
                phrases.put_nowait(None)
                stage = "tts"
                await speaker
        except asyncio.CancelledError:
            speaker.cancel()
            raise
        except Exception as error:
            speaker.cancel()
            if limit.expired():
                seconds = self.options.max_turn_s
                message = f"the reply took longer than the {seconds:g} s limit (VOICEAGENT_MAX_TURN_S)"
                raise ReplyFailed(stage, TimeoutError(message), code="turn_too_long") from error
            raise ReplyFailed(stage, error) from error
        self.history.append({"role": "assistant", "content": reply.strip()})
        self.answered = turn
        self.emit(TurnEnded(self.clock.now_ns(), turn, "done", reply.strip()))
        self.trace.write(TURN_END, turn, reason="done", reply=reply.strip())

    def _on_block(self, turn: int, block: ReplyBlock, first: bool, preemptive: bool) -> None:
        drafted, accepted = block.n_drafted, block.n_accepted
        self.emit(ReplyText(self.clock.now_ns(), turn, block.text, drafted, accepted, first))
        if first:
            self.trace.write(
                LLM_FIRST_BLOCK, turn, n_drafted=drafted, n_accepted=accepted, preemptive=preemptive
            )
        counts = {"n_tokens": block.n_tokens, "n_drafted": drafted, "n_accepted": accepted}
        costs = (
            {}
            if block.timing is None
            else {f"{k}_ms": v for k, v in dataclasses.asdict(block.timing).items()}
        )
        self.trace.write(LLM_BLOCK, turn, text=block.text, **counts, **costs)

    async def _speak(self, turn: int, phrases: asyncio.Queue[str | None], ahead: SpokenAhead | None) -> None:
        rate = self.options.output_rate
        spoken = self.spoken.setdefault(turn, SpokenReply())
        while (phrase := await phrases.get()) is not None:
            self.trace.write(CHUNK_PHRASE, turn, words=len(phrase.split()))
            made = await _made_ahead(ahead, phrase)
            ahead = None  # only a reply's first phrase is made ahead
            async for samples in self._audio(phrase, made):
                if not spoken.phrases:
                    self.trace.write(TTS_FIRST_AUDIO, turn, phrase=phrase, ahead=made is not None)
                    self.endpointer.set_guard(self.options.echo_guard)
                spoken.add_audio(phrase, len(samples))
                self.emit(SpeechAudio(self.clock.now_ns(), turn, samples, rate, phrase))

    async def _audio(self, phrase: str, made: list[np.ndarray] | None) -> AsyncIterator[np.ndarray]:
        """The phrase's audio at the output rate: made ahead, else synthesised chunk by chunk now."""
        if made is not None:
            for chunk in made:
                yield chunk
            return
        chunks = synthesize_at(self.synthesizer, phrase, self.options.output_rate)  # one resampler
        while (samples := await _next_in_thread(chunks, self.lane)) is not None:
            yield samples

    async def render(self, phrase: str) -> list[np.ndarray]:
        """The whole audio of `phrase` at the output rate, synthesised in a TTS worker thread, in the lane."""
        rate = self.options.output_rate
        audio = lambda: list(synthesize_at(self.synthesizer, phrase, rate))  # noqa: E731
        job = _TTS_POOL.submit(self.lane.run_begun, self.lane.begin(), audio)
        return await asyncio.wrap_future(job)

    def playing(self, turn: int) -> bool:
        """Audio of the turn's reply was made and the transport has not yet played all of it."""
        spoken = self.spoken.get(turn)
        return spoken is not None and spoken.played_samples < spoken.total_samples

    def played(self, turn: int, samples: int) -> None:
        """The transport confirmed `samples` of the turn's audio as played."""
        spoken = self.spoken.setdefault(turn, SpokenReply())
        spoken.played_samples = max(spoken.played_samples, samples)

    def keep_heard(self, turn: int) -> str:
        """After a barge-in on `turn`: the history keeps only the words of its reply the user heard
        (returned), not the whole reply nor nothing."""
        heard = self.spoken.get(turn, SpokenReply()).played_text()
        if self.answered == turn:  # the whole reply is in the history, but not all of it was heard
            self.history.pop()
        if heard:
            self.history.append({"role": "assistant", "content": heard})
        return heard
