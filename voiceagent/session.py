"""A voice session: turn-taking and barge-in around VAD -> ASR -> LLM -> phrase chunker -> TTS.

Audio frames come in (`push_audio`, PCM16 mono 16 kHz, 20 ms); typed events come out (`events()`), the
agent's speech among them as `SpeechAudio` at the session's output rate. The transport plays that audio
and reports back (`audio_sent`, `audio_played`), which is how the trace knows when the first audio went
out and how a barge-in knows what the user heard.

- Partial transcripts are decoded while the user speaks and once at their pause (voiceagent/partials.py);
  the reply starts on the pause's, or on an earlier one that heard every word (voiceagent/preempt.py), its
  first phrase rendered too, while the endpointer waits out its end-of-speech silence. The final reuses it;
  the reply is kept if it answers the same words, else restarted with the cancelled reply's ids proposed.
  CPU-heavy calls (ASR, TTS) run in worker threads, in the CPU lane with the engine (voiceagent/cpu_lane.py).
- The reply (voiceagent/reply.py) streams committed blocks from the LLM; the chunker turns them into
  phrases and TTS speaks each phrase as soon as it exists, so the LLM keeps writing while TTS speaks.
- Speech from the user while the agent thinks or speaks holds the reply (voiceagent/barge_in.py); real
  words interrupt the turn: its tasks are cancelled, its queued reply events (`InterruptibleEvent`s) are
  dropped, and the history keeps only the words already played. A backchannel or a cough resumes it. Such
  speech is heard by a recogniser of its own where there is one (voiceagent/recognizers.py).
- A failing stage ends the turn with a `TurnError`; the session keeps listening. So does a turn that runs
  over `max_turn_s` (code "turn_too_long"): an utterance that long is cut off there and not answered (the
  session listens again once the user pauses), and a reply still being made after that long is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

import numpy as np

from voiceagent.audio import FRAME_MS, FRAME_SAMPLES
from voiceagent.barge_in import BargeIns
from voiceagent.clock import Clock
from voiceagent.cpu_lane import NO_LANE, CpuLane
from voiceagent.endpointing import ScoredEndpointing
from voiceagent.events import (
    Event,
    Interrupted,
    InterruptibleEvent,
    SpeechAudio,
    SpeechEnded,
    SpeechStarted,
    TranscriptFinal,
    TranscriptPartial,
    TurnError,
)
from voiceagent.llm import LLM, ReplyBlock
from voiceagent.partials import PartialSchedule, final_trailing_ms, words_ahead
from voiceagent.preempt import Preemption, PreemptiveReply, SpeakAhead
from voiceagent.reply import Replier, ReplyFailed
from voiceagent.session_options import SessionOptions
from voiceagent.stages import (
    ChunkerLike,
    EndpointerLike,
    PartialStopped,
    RecognizerLike,
    StoppableRecognizer,
    TurnAudioModel,
    VadEdgeLike,
    heard_audio,
    heard_confidence,
    start_utterance,
)
from voiceagent.trace import (
    ASR_FINAL,
    ASR_PARTIAL,
    ASR_PARTIAL_ERROR,
    ASR_PARTIAL_STOPPED,
    OUT_FIRST_AUDIO,
    OUT_PLAYED,
    TURN_ERROR,
    TURN_INTERRUPTED,
    VAD_SPEECH_END,
    VAD_SPEECH_START,
    Trace,
)
from voiceagent.tts import Synthesizer


class Session:
    def __init__(
        self,
        *,
        endpointer: EndpointerLike,
        recognizer: RecognizerLike,
        llm: LLM,
        synthesizer: Synthesizer,
        new_chunker: Callable[[], ChunkerLike],
        clock: Clock,
        trace: Trace,
        options: SessionOptions | None = None,
        lane: CpuLane = NO_LANE,
        turn_audio: TurnAudioModel | None = None,
    ) -> None:
        self.endpointer, self.recognizer, self._llm, self.lane = endpointer, recognizer, llm, lane
        self.clock, self.trace = clock, trace
        self.options = options or SessionOptions()
        self.history: list[dict[str, str]] = [{"role": "system", "content": self.options.system_prompt}]
        self.replier = Replier(
            synthesizer=synthesizer,
            new_chunker=new_chunker,
            endpointer=endpointer,
            clock=clock,
            trace=trace,
            options=self.options,
            history=self.history,
            emit=self._emit,
            lane=lane,
        )
        self.turn = 0
        self._events: asyncio.Queue[Event | None] = asyncio.Queue()
        self._dropped_turns: set[int] = set()
        self._utterance_open = False
        self._utterance_start_ns = 0
        self._cut_turn = 0  # an utterance cut off at max_turn_s: its speech_end is not answered
        self._decoding: asyncio.Task[None] | None = None
        # Where the audio of the partial being decoded ends, while it may still be stopped for a pause
        # partial (voiceagent/partials.py); None: none is decoding.
        self._stoppable_until_ns: int | None = None
        # Frames that arrive between speech_end and the final's decode: held back from the recogniser, which
        # is told how much of the audio it holds is the silence after the words (`trailing_ms`), until the
        # final has its audio; then they go to it as the next utterance's pre-roll.
        self._after_end: list[np.ndarray] | None = None
        self.partials = PartialSchedule(
            self.options.partial_every_ms,
            self.options.pause_ms,
            self.options.late_pause_ms,
            self.options.pause_quiet_ms,
        )
        self._reply: asyncio.Task[None] | None = None
        self._first_out: set[int] = set()
        audio_scorer = None
        if turn_audio is not None:  # a speech job: the engine waits for it (voiceagent/cpu_lane.py)
            audio_scorer = functools.partial(lane.in_thread, turn_audio.probability)
        self.endpointing = ScoredEndpointing(
            llm, endpointer, self.options.turn_taking, clock, trace, audio_scorer=audio_scorer
        )
        ahead = SpeakAhead(new_chunker, self.replier.render) if self.options.speak_ahead else None
        self.preemption = Preemption(
            llm, self.options.reply, trace, self.options.prefill_while_speaking, ahead
        )
        self.barge_ins = BargeIns(
            clock=clock,
            trace=trace,
            events=self._events,
            interrupt=self._interrupt,
            playing=self.replier.playing,
            resume_after_ms=self.options.resume_after_ms,
        )
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def llm(self) -> LLM:
        return self._llm

    @llm.setter
    def llm(self, llm: LLM) -> None:
        """Swaps the session's LLM (its head starts and end-of-turn scores follow)."""
        self._llm = self.preemption.llm = llm
        self.endpointing.use(llm)

    # ----- input -----------------------------------------------------------------------------------

    async def push_audio(self, frame: np.ndarray, t_ns: int | None = None) -> None:
        """One frame of the user's audio: [320] int16, PCM16 mono 16 kHz."""
        if frame.shape != (FRAME_SAMPLES,) or frame.dtype != np.int16:
            raise ValueError(f"audio frames must be [{FRAME_SAMPLES}] int16, got {frame.shape} {frame.dtype}")
        t = self.clock.now_ns() if t_ns is None else t_ns
        self.trace.record_audio(frame, t, self.turn)
        # Every frame goes to the recogniser: before speech_start it keeps them as pre-roll, since the VAD
        # decides a start only after some voiced audio.
        if self._after_end is None:
            self.recognizer.push(frame)
        else:
            self._after_end.append(frame)
        self.barge_ins.tick(t)
        self.endpointing.before_frame(scoring=self._decoding is not None)
        for edge in self.endpointer.push(frame, t):
            if edge.kind == "speech_start":
                self._start_utterance(edge)
            elif edge.kind == "speech_end":
                self._end_utterance(edge)
        limit = self.options.max_turn_s
        if self._utterance_open and limit is not None and t - self._utterance_start_ns > limit * 1e9:
            self._cut_utterance()
        if self._utterance_open:
            self._schedule_partial(t)

    def _schedule_partial(self, t: int) -> None:
        """The partial due now (voiceagent/partials.py), in a task of its own."""
        silence_ms, quiet_ms = self.endpointer.silence_ms(), self.endpointer.quiet_ms()
        if not self.partials.silent(silence_ms, quiet_ms):  # the user spoke on: a reply guessed at a pause
            self._drop_preemption("speech resumed")  # is stale
        heard = self.preemption.heard_all(self.endpointing.heard_all) is not None  # a stand-in (partials.py)
        busy = self._decoding is not None
        if busy and self.partials.pause_due(silence_ms, quiet_ms, heard):
            self._stop_partial()
        kind = self.partials.due(t, silence_ms, busy=busy, heard=heard, quiet_ms=quiet_ms)
        if kind is not None:
            heard_until_ns = t + FRAME_MS * 1_000_000  # the end of the audio it will hear
            self._stoppable_until_ns = heard_until_ns
            self._decoding = asyncio.create_task(
                self._partial(self.turn, heard_until_ns, pause=kind == "pause")
            )

    def _stop_partial(self) -> None:
        """A pause partial is due: stops the partial still decoding if its audio ends before the last words
        said (a regular one, or one begun in an earlier pause that the user spoke on past): it could not
        end the turn, and the pause partial would wait for it."""
        heard_until_ns = self._stoppable_until_ns
        if heard_until_ns is None or self.endpointing.heard_all(heard_until_ns):
            return
        if isinstance(self.recognizer, StoppableRecognizer):  # (again each frame: it may not have begun)
            self.recognizer.stop_partial()

    async def push_text(self, text: str) -> None:
        """A typed user message: answered like a final transcript (interrupting any reply)."""
        if self.replying:
            self._interrupt()
        self.turn += 1
        self._emit(TranscriptFinal(self.clock.now_ns(), self.turn, text))
        self.trace.write(ASR_FINAL, self.turn, text=text, typed=True)
        self._start_reply(self._respond(self.turn, text))

    # ----- output ----------------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[Event]:
        """The session's events until `close()`; output events of interrupted turns are left out, those of a
        held reply wait until it resumes."""
        while (event := await self._events.get()) is not None:
            if isinstance(event, InterruptibleEvent) and event.turn_id in self._dropped_turns:
                continue
            if self.barge_ins.holds_back(event):
                continue
            yield event

    def audio_sent(self, event: SpeechAudio) -> None:
        """The transport handed this audio to the wire (the first one of a turn is out.first_audio)."""
        if event.turn_id not in self._first_out and event.turn_id not in self._dropped_turns:
            self._first_out.add(event.turn_id)
            self.trace.write(OUT_FIRST_AUDIO, event.turn_id)

    def audio_played(self, turn: int, samples: int) -> None:
        """The transport confirmed `samples` of the turn's audio as played (marks, or its clock)."""
        self.replier.played(turn, samples)
        ms = 1000 * samples / self.options.output_rate
        self.trace.write(OUT_PLAYED, turn, samples=samples, ms=ms)
        self._maybe_done_speaking(turn)

    def _maybe_done_speaking(self, turn: int) -> None:
        """Back to listening (echo guard off) once the turn's reply is complete and all of it played."""
        if not self.replying:
            self.endpointer.set_guard(False)
        self._update_idle()

    async def wait_idle(self) -> None:
        """Returns once nobody is speaking: no utterance open, no reply pending, all reply audio played."""
        await self._idle.wait()

    def _update_idle(self) -> None:
        if self._utterance_open or self.replying:
            self._idle.clear()
        else:
            self._idle.set()

    async def close(self) -> None:
        """Cancels the session's work and ends `events()` (again: no harm); a cancellation of the caller
        meanwhile is passed on once closed."""
        current = asyncio.current_task()
        pending = current.cancelling() if current is not None else 0
        self._drop_preemption("session closed")
        for task in (self.barge_ins.forget(), self._reply, self._decoding, self.preemption.prefilling):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._events.put_nowait(None)
        if current is not None and current.cancelling() > pending:
            raise asyncio.CancelledError

    # ----- listening -------------------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        self._events.put_nowait(event)

    @property
    def replying(self) -> bool:
        """The agent is thinking, speaking, or its audio is still playing at the transport."""
        current = asyncio.current_task()
        if self._reply is not None and not self._reply.done() and self._reply is not current:
            return True
        return self.replier.playing(self.turn) or self.barge_ins.replying()

    def _start_utterance(self, edge: VadEdgeLike) -> None:
        over_reply = self.replying
        if over_reply:
            if self.barge_ins.enabled:
                held = self.barge_ins.current()
                self.barge_ins.hold(held.turn if held is not None else self.turn, self._reply, edge.t_ns)
            else:
                self._interrupt()
        self._drop_preemption("new utterance")
        self.turn += 1
        self._utterance_open = True
        self._utterance_start_ns = edge.t_ns
        self.preemption.prefilled = ""
        self.partials.start_utterance(edge.confirmed_ns)
        start_utterance(self.recognizer, over_reply)  # (waits for a final still decoding to take its audio)
        self._push_held_frames()  # the audio since the last speech_end begins this utterance
        self.endpointing.start_utterance()
        self._update_idle()
        self._emit(SpeechStarted(edge.t_ns, self.turn))
        self.trace.write(VAD_SPEECH_START, self.turn, t_ns=edge.t_ns, confirmed_ns=edge.confirmed_ns)

    def _cut_utterance(self) -> None:
        """The user has spoken for longer than max_turn_s: the turn ends unanswered, with an error."""
        turn, limit = self.turn, self.options.max_turn_s
        self._utterance_open = False
        self._cut_turn = turn
        self._drop_preemption("utterance too long")
        message = f"the utterance was longer than the {limit:g} s limit (VOICEAGENT_MAX_TURN_S); not answered"
        self._turn_error(turn, "input", message, "turn_too_long")
        self._update_idle()

    def _end_utterance(self, edge: VadEdgeLike) -> None:
        if self._cut_turn == self.turn:  # the end of an utterance already cut off
            self._cut_turn = 0
            return
        self._utterance_open = False
        self._emit(SpeechEnded(edge.t_ns, self.turn, confirmed_ns=edge.confirmed_ns))
        self.trace.write(VAD_SPEECH_END, self.turn, t_ns=edge.t_ns, confirmed_ns=edge.confirmed_ns)
        stood_in_ns = self.preemption.heard_all(self.endpointing.heard_all) if self.partials.paused else None
        trailing_ms = final_trailing_ms(edge.confirmed_ns + FRAME_MS * 1_000_000, edge.t_ns, stood_in_ns)
        self._after_end = []  # the final may wait for a partial still decoding: no more audio meanwhile
        self._start_reply(self._finalize_and_respond(self.turn, trailing_ms, stood_in_ns is not None))

    def _push_held_frames(self) -> None:
        """The frames held back since speech_end, to the recogniser (its final has its audio)."""
        held, self._after_end = self._after_end, None
        for frame in held or ():
            self.recognizer.push(frame)

    def _start_reply(self, work: Coroutine[Any, Any, None]) -> None:
        self._reply = asyncio.create_task(work)
        self._reply.add_done_callback(lambda _: self._update_idle())
        self._update_idle()

    async def _partial(self, turn: int, heard_until_ns: int, pause: bool = False) -> None:
        """A partial transcript of the audio up to `heard_until_ns` (the end of the frame it was due at):
        traced, scored, and a head start."""
        asked_ns = self.clock.now_ns()
        try:
            try:
                transcript = await self.lane.in_thread(self.recognizer.decode_partial)
            finally:
                self._stoppable_until_ns = None
            decode_ms = (self.clock.now_ns() - asked_ns) / 1e6
            # A regular partial that returns after the user spoke on past its audio cannot end the turn nor
            # start a reply that will be kept: its score and head start would only slow the next partial.
            heard_all = pause or self.endpointing.heard_all(heard_until_ns)
            if turn == self.turn and self._utterance_open and heard_all:
                messages = self._with_user(transcript.text.strip())
                await self.preemption.stop_other(turn, messages)  # the LLM is free to score new words
                audio = heard_audio(transcript)
                confidence = heard_confidence(transcript)
                replies = self._starts_reply(pause, messages[-1]["content"])  # its start rides on the score
                await self.endpointing.score(
                    turn, messages, heard_until_ns, audio, confidence, reply_next=replies
                )
            if turn == self.turn and self._utterance_open:
                stable, text = transcript.stable, transcript.text
                self._emit(TranscriptPartial(self.clock.now_ns(), turn, stable, text))
                self.trace.write(ASR_PARTIAL, turn, stable=stable, text=text, pause=pause, ms=decode_ms)
                self.barge_ins.heard(text, final=False)  # real words end a held reply
                if not self.barge_ins.replying():  # no head start while a held reply may resume
                    heard_ns = heard_until_ns if heard_all else None
                    self._head_start(turn, stable.strip(), text.strip(), pause, heard_ns)
        except PartialStopped:
            self.trace.write(ASR_PARTIAL_STOPPED, turn, heard_until_ns=heard_until_ns)
        except Exception as error:  # a partial is only a preview: note it and carry on
            self.trace.write(ASR_PARTIAL_ERROR, turn, message=str(error))
        finally:
            self._decoding = None

    def _head_start(self, turn: int, stable: str, text: str, pause: bool, heard_ns: int | None) -> None:
        """A partial that returns in silence having heard every word said (up to `heard_ns`; None: not all)
        starts the reply (it stands in for the pause partial, or that confirms it or starts it again); while
        the user still speaks, its words are fed (`words_ahead`: its guess but the last word, at least the
        stable words). Not once they are quiet: the pause partial is near, and a forward then would hold
        up its decode and score."""
        if heard_ns is not None and self._starts_reply(pause, text):
            self.preemption.start(turn, self._with_user(text), text, heard_ns)
        elif not pause and self.endpointer.silence_ms() == 0.0:
            ahead = words_ahead(stable, text)
            self.preemption.prefill(turn, self._with_user(ahead), ahead)

    def _starts_reply(self, pause: bool, text: str) -> bool:
        """Whether a partial of `text` that heard every word said starts the preemptive reply now: in the
        pause (the pause partial, or half the pause's silence heard), with replies ahead on and no held
        reply that may resume."""
        silent = (pause and self.partials.paused) or self.endpointer.silence_ms() >= self.options.pause_ms / 2
        return silent and self.options.preemptive_reply and bool(text) and not self.barge_ins.replying()

    async def _finalize_and_respond(self, turn: int, trailing_ms: float, stood_in: bool) -> None:
        """The final transcript (`stood_in`: told to reuse the partial a running reply began on), then the
        reply."""
        asked_ns = self.clock.now_ns()
        try:
            try:
                text = (await self.lane.in_thread(self.recognizer.decode_final, trailing_ms)).strip()
            finally:
                self._push_held_frames()
        except Exception as error:
            self._drop_preemption("asr failed")
            self._fail(turn, "asr", error)
            return
        self._emit(TranscriptFinal(self.clock.now_ns(), turn, text))
        ms = (self.clock.now_ns() - asked_ns) / 1e6
        self.trace.write(ASR_FINAL, turn, text=text, ms=ms, stood_in=stood_in)
        if self.barge_ins.heard(text, final=True):  # a backchannel over the reply: it goes on, unanswered
            self._drop_preemption("backchannel")
            return
        preempt, proposal = self.preemption.take(turn, self._with_user(text) if text else None)
        if text and turn == self.turn:
            await self._respond(turn, text, preempt, proposal)
        elif preempt is not None:
            preempt.cancel()

    def _with_user(self, text: str) -> list[dict[str, str]]:
        return [*self.history, {"role": "user", "content": text}]

    def _drop_preemption(self, reason: str) -> None:
        self.preemption.drop(self.turn, reason)

    # ----- replying --------------------------------------------------------------------------------

    async def _respond(
        self,
        turn: int,
        user_text: str,
        preempt: PreemptiveReply | None = None,
        proposal: Sequence[int] = (),
    ) -> None:
        """The reply to `user_text`: the preemptive one when it was kept, else a new one (verifying
        `proposal`, the ids of a cancelled preemptive reply, as its likely start)."""
        blocks: AsyncIterator[ReplyBlock] = (
            preempt.blocks()
            if preempt is not None
            else self.preemption.stream(turn, self._with_user(user_text), proposal)
        )
        try:
            ahead = preempt.take_spoken_ahead() if preempt is not None else None
            await self.replier.respond(turn, user_text, blocks, preemptive=preempt is not None, ahead=ahead)
        except ReplyFailed as failure:
            self._fail(turn, failure.stage, failure.error, failure.code)
        finally:
            if preempt is not None:
                preempt.cancel()  # a no-op once its stream has ended
            self._maybe_done_speaking(turn)

    def _interrupt(self, turn: int | None = None, task: asyncio.Task[None] | None = None) -> None:
        """Ends the reply of `turn` (default: the current turn's, made by the current reply task)."""
        if turn is None:
            turn, task = self.turn, self._reply
            self._drop_preemption("barge-in")
            if (held := self.barge_ins.current()) is not None:  # a typed message over a held reply
                self._interrupt(held.turn, self.barge_ins.forget())
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        self._dropped_turns.add(turn)
        heard = self.replier.keep_heard(turn)
        self.endpointer.set_guard(False)
        self._emit(Interrupted(self.clock.now_ns(), turn, heard))
        self.trace.write(TURN_INTERRUPTED, turn, spoken_text=heard)

    def _fail(self, turn: int, stage: str, error: Exception, code: str = "turn_failed") -> None:
        self._turn_error(turn, stage, f"{type(error).__name__}: {error}", code)

    def _turn_error(self, turn: int, stage: str, message: str, code: str) -> None:
        """The turn ends with an error event (and its trace record); the session keeps listening."""
        self._emit(TurnError(self.clock.now_ns(), turn, stage, message, code))
        self.trace.write(TURN_ERROR, turn, stage=stage, code=code, message=message)
