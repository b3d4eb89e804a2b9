"""Our turn-taking on a clip: the real components, in the order and at the pace the session runs them.

`record` streams a clip frame by frame through `Endpointer` (Silero VAD), the session's recogniser
(VOICEAGENT_ASR_MODEL) and `LocalLLM.end_of_turn_probability` (VOICEAGENT_TURN_SCORE_MODEL), on the session's
schedule (`PartialSchedule` with `SessionOptions`' times: a partial every 300 ms while the user speaks, pause
partials at 32 ms of quiet or silence and at 128 ms of silence, the first not while a reply runs on a
regular partial that returned in the silence having heard every word, as in the session), each partial's
whole guess (`Transcript.text`) scored at once (the same words as the utterance's last scored partial's,
case and punctuation aside, keep its score, as in the session: `endpointing.scored_words`).
Time is the audio's: a partial decodes the audio pushed so far, and its score becomes known `asr_s +
score_s` (measured wall time) later; no partial starts while one is in flight, as in the session. As in
the session, a regular partial that returns after the user spoke on past its audio (by more than
the default `heard_slack_ms`) is not scored (`Scored.score` None, `skipped`): it could not end the turn; if
Silero still hears speech when it returns, its words are fed to the draft instead (`words_ahead`,
`LocalLLM.prefill(draft_only=True)`: the session's head start). As in the session, that forward does not
hold up the next partial's decode, only its score (`Scored.known_ns` of the next one counts from the
forward's end if it ends later). As in the session, a partial still decoding when a pause partial falls
due, whose audio ends before the last words (a regular one, or a pause partial of a pause the user
spoke on past), is stopped then (`Scored.stopped`; a timer calls the
recogniser's `stop_partial` that long after the decode began, in wall time). The
endpointer never ends the speech here (its wait is a minute), so the record holds every score the
utterance would get up to its first end, whatever the policy.

`replay` then re-runs the endpointer on the clip's audio with Silero's recorded probabilities (exact, and
~100x cheaper) under a policy: the fixed silence rule, or `EndOfTurnWait` fed the recorded scores at the
times they became known. The first speech_end is where the turn would end.

With Smart Turn (`record(turn_audio=...)`) each scored partial's audio is scored too, after its words, and
a policy that weighs the audio (`audio_weight` > 0) knows the fused score that inference's time later
(`Scored.known_under`); the schedule of later partials is the words' alone (a partial's audio costs
~30-60 ms, well inside the 300 ms between partials).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.turn_taking.clips import Clip
from voiceagent.audio import frames, read_wav
from voiceagent.endpointing import scored_words
from voiceagent.llm import LocalLLM
from voiceagent.llm_types import Message
from voiceagent.partials import PartialSchedule, words_ahead
from voiceagent.session_options import SessionOptions
from voiceagent.stages import (
    PartialStopped,
    RecognizerLike,
    StoppableRecognizer,
    TranscriptLike,
    TurnAudioModel,
    heard_audio,
    heard_confidence,
    start_utterance,
)
from voiceagent.turn_taking import EndOfTurnWait, TurnTakingOptions, heard_all
from voiceagent.vad import Endpointer, SileroVad, VadOptions, load_silero

FRAME_NS = 20_000_000
PARTIAL_EVERY_MS = SessionOptions().partial_every_ms
PAUSE_MS = SessionOptions().pause_ms
LATE_PAUSE_MS = SessionOptions().late_pause_ms
NEVER_MS = 60_000


@dataclass(frozen=True)
class Scored:
    """One partial and its end-of-turn score."""

    known_ns: int  # when the score was known (audio time)
    heard_until_ns: int  # the end of the audio the partial decoded
    score: float | None
    text: str
    asr_s: float
    score_s: float
    pause: bool  # the partial at the pause
    skipped: bool = False  # returned after the user spoke on past its audio: not scored (as the session)
    prefill_s: float = 0.0  # a skipped partial's head start: its words fed while the user speaks on
    audio_score: float | None = None  # Smart Turn on the partial's audio (None: not run)
    audio_s: float = 0.0  # its time: a policy that weighs it knows the score this much after known_ns
    raw_score: float | None = None  # the model's own P(end | words) where `score` is its trained head's
    confidence: float | None = None  # the recogniser's least token probability (None: it did not say)
    stopped: bool = False  # stopped for the pause partial (`skipped` too): `asr_s` is until it stopped

    def known_under(self, policy: TurnTakingOptions) -> int:
        """When the score is known under `policy`: later by the audio's inference if it weighs the audio."""
        return self.known_ns + (int(self.audio_s * 1e9) if policy.audio_weight > 0 else 0)


@dataclass
class Recording:
    clip: Clip
    probabilities: list[float] = field(default_factory=list)  # Silero's, one per 32 ms chunk
    scored: list[Scored] = field(default_factory=list)
    speech_start_ns: int | None = None
    final_text: str = ""


class _RecordingVad:
    """Silero, remembering every probability it gives."""

    def __init__(self, model: SileroVad, probabilities: list[float]) -> None:
        self.model, self.probabilities = model, probabilities

    def probability(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        probability, state = self.model.probability(window, state)
        self.probabilities.append(probability)
        return probability, state


class _ReplayVad:
    """The recorded probabilities, in order."""

    def __init__(self, probabilities: list[float]) -> None:
        self._next = iter(probabilities)

    def probability(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        return next(self._next), state


async def record(
    clip: Clip,
    recognizer: RecognizerLike,
    llm: LocalLLM,
    system_prompt: str,
    turn_audio: TurnAudioModel | None = None,
    *,
    pause_quiet_ms: int,
) -> Recording:
    """The clip through the real components (see the module docstring); `turn_audio` (Smart Turn) also
    scores each scored partial's audio; `pause_quiet_ms`, the schedule's quiet start (the session's is
    VOICEAGENT_TURN_PAUSE_QUIET_MS)."""
    rec = Recording(clip)
    endpointer = Endpointer(
        VadOptions(end_silence_ms=NEVER_MS), model=_RecordingVad(load_silero(), rec.probabilities)
    )  # type: ignore[arg-type]
    vad = _vad_by_frame(clip)
    schedule = PartialSchedule(PARTIAL_EVERY_MS, PAUSE_MS, LATE_PAUSE_MS, pause_quiet_ms)
    reply = _StandIn(schedule)
    busy_until_ns = engine_free_ns = 0
    for i, frame in enumerate(frames(_audio(clip.path))):
        t = i * FRAME_NS
        recognizer.push(frame)
        for edge in endpointer.push(frame, t):
            if edge.kind == "speech_start" and rec.speech_start_ns is None:
                rec.speech_start_ns = edge.t_ns
                schedule.start_utterance(edge.confirmed_ns)
                start_utterance(recognizer, over_reply=clip.kind == "backchannel")  # as the session does
        if rec.speech_start_ns is None:
            continue
        silence_ms, quiet_ms = endpointer.silence_ms(), endpointer.quiet_ms()
        heard = reply.update(t, silence_ms, quiet_ms, endpointer.last_voiced_ns())
        kind = schedule.due(t, silence_ms, busy=t < busy_until_ns, heard=heard, quiet_ms=quiet_ms)
        if kind is None:
            continue
        last = next((s for s in reversed(rec.scored) if s.score is not None), None)  # the words scored last
        pause = kind == "pause"
        stop_ns = _stop_at(schedule, vad, i, t + FRAME_NS)
        transcript, scored = await _partial(
            recognizer, llm, system_prompt, t + FRAME_NS, pause, last, vad, stop_ns
        )
        if scored.skipped:  # its head start holds up the engine, not the recogniser
            engine_free_ns = scored.known_ns + int(scored.prefill_s * 1e9)
        elif scored.score_s > 0.0 and engine_free_ns > scored.known_ns - int(scored.score_s * 1e9):
            # the score waited for that forward (LocalLLM runs one job at a time)
            scored = dataclasses.replace(scored, known_ns=engine_free_ns + int(scored.score_s * 1e9))
        audio = None if transcript is None else heard_audio(transcript)
        if turn_audio is not None and audio is not None and scored.score is not None:
            started = time.perf_counter()
            audio_score = turn_audio.probability(audio)
            audio_s = time.perf_counter() - started
            scored = dataclasses.replace(scored, audio_score=audio_score, audio_s=audio_s)
        rec.scored.append(scored)
        reply.returned(scored)
        busy_until_ns = scored.known_ns
    if rec.speech_start_ns is not None:
        rec.final_text = recognizer.decode_final(1000.0)
    return rec


class _StandIn:
    """The session's preemptive reply on a regular partial, as far as the schedule sees it: started when
    a partial that heard every word returns in the silence (at its `known_ns`), dropped when the user
    speaks on. While it runs on a partial that still heard every word, the first pause partial is not
    decoded."""

    def __init__(self, schedule: PartialSchedule) -> None:
        self.schedule = schedule
        self._returning: Scored | None = None
        self._heard_until_ns: int | None = None

    def returned(self, scored: Scored) -> None:
        self._returning = None if scored.skipped or not scored.text.strip() else scored

    def update(self, t_ns: int, silence_ms: float, quiet_ms: float, last_voiced_ns: int) -> bool:
        """At the frame of `t_ns`: whether a reply runs on a partial that heard every word said."""
        if not self.schedule.silent(silence_ms, quiet_ms):  # spoke on: the session drops the reply
            self._heard_until_ns = None
        returning = self._returning
        if returning is not None and returning.known_ns <= t_ns:
            self._returning = None
            if returning.pause or silence_ms >= PAUSE_MS / 2:  # as `VoiceSession._head_start`
                self._heard_until_ns = returning.heard_until_ns
        heard_until = self._heard_until_ns
        return heard_until is not None and heard_all(heard_until, last_voiced_ns)


def _stop_at(schedule: PartialSchedule, vad: _FrameVad, frame: int, heard_until_ns: int) -> int | None:
    """When the session would stop a partial started at `frame` that hears the audio up to
    `heard_until_ns` (session.py `_stop_partial`): at the end of the first later frame where a pause
    partial falls due and its audio ends before the last words. None: never (were it still decoding).
    The schedule is followed on a copy, busy all along."""
    ahead = copy.copy(schedule)
    for k in range(frame + 1, len(vad.silence_ms)):
        silence_ms, quiet_ms = vad.silence_ms[k], vad.quiet_ms[k]
        ahead.due(k * FRAME_NS, silence_ms, busy=True, quiet_ms=quiet_ms)  # (speech restarts its stages)
        if ahead.pause_due(silence_ms, quiet_ms) and not heard_all(heard_until_ns, vad.last_voiced_ns[k]):
            return (k + 1) * FRAME_NS
    return None


def _decode_partial(recognizer: RecognizerLike, stop_after_s: float | None) -> TranscriptLike | None:
    """The recogniser's partial, stopped `stop_after_s` after it began (wall time) if it has not returned
    by then and the recogniser can be stopped (None: it was)."""
    timer = None
    if stop_after_s is not None and isinstance(recognizer, StoppableRecognizer):
        timer = threading.Timer(stop_after_s, recognizer.stop_partial)
        timer.start()
    try:
        return recognizer.decode_partial()
    except PartialStopped:
        return None
    finally:
        if timer is not None:
            timer.cancel()


async def _partial(
    recognizer: RecognizerLike,
    llm: LocalLLM,
    system_prompt: str,
    heard_until_ns: int,
    pause: bool,
    last: Scored | None,
    vad: _FrameVad,
    stop_ns: int | None = None,
) -> tuple[TranscriptLike | None, Scored]:
    """A partial (its transcript) and its score (the last one's again, without a forward, for the same
    words; none if it returned after the user spoke on past its audio: then the session's head start,
    whose time is `prefill_s`). Stopped at `stop_ns` (audio time) if still decoding then: no transcript."""
    started = time.perf_counter()
    stop_after_s = None if stop_ns is None else (stop_ns - heard_until_ns) / 1e9
    transcript = _decode_partial(recognizer, stop_after_s)
    asr_s = time.perf_counter() - started
    returned_ns = heard_until_ns + int(asr_s * 1e9)
    if transcript is None:
        return None, Scored(returned_ns, heard_until_ns, None, "", asr_s, 0.0, pause, True, stopped=True)
    frame = min(len(vad.last_voiced_ns) - 1, returned_ns // FRAME_NS)
    if not pause and not heard_all(heard_until_ns, vad.last_voiced_ns[frame]):
        started = time.perf_counter()  # as `VoiceSession._head_start`: only while Silero hears speech
        ahead = words_ahead(transcript.stable.strip(), transcript.text.strip())
        if ahead and vad.silence_ms[frame] == 0.0:
            messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": ahead}]
            await llm.prefill(messages, draft_only=True)
        prefill_s = time.perf_counter() - started
        text = transcript.text
        return transcript, Scored(returned_ns, heard_until_ns, None, text, asr_s, 0.0, pause, True, prefill_s)
    messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": transcript.text}]
    started = time.perf_counter()
    same_words = last is not None and scored_words(last.text) == scored_words(transcript.text)
    if same_words and last is not None and last.score is not None:
        score: float | None = last.score
    else:
        score = await llm.end_of_turn_probability(messages) if transcript.text.strip() else None
    score_s = time.perf_counter() - started
    known_ns = heard_until_ns + int((asr_s + score_s) * 1e9)
    raw = None  # recorded only where the head scores: the score itself otherwise
    if llm.turn_head and score is not None:
        raw = await _raw_score(llm, messages, last, transcript.text)
    scored = Scored(known_ns, heard_until_ns, score, transcript.text, asr_s, score_s, pause, raw_score=raw,
                    confidence=heard_confidence(transcript))  # fmt: skip
    return transcript, scored


async def _raw_score(
    llm: LocalLLM, messages: Sequence[Message], last: Scored | None, text: str
) -> float | None:
    """The raw score beside the head's (untimed: only the head's decides in the session; the words are
    cached, so it costs one id's forward)."""
    if last is not None and scored_words(last.text) == scored_words(text) and last.raw_score is not None:
        return last.raw_score
    return await llm.end_of_turn_probability(messages, learned=False)


def head_scored(recordings: list[Recording]) -> bool:
    """Whether a trained head scored these recordings (and the raw score was recorded beside it)."""
    return any(s.raw_score is not None for r in recordings for s in r.scored)


def raw_scores(rec: Recording) -> Recording:
    """The recording with the raw scores in place of the head's: the session without its head."""
    scored = [dataclasses.replace(s, score=s.raw_score) if s.raw_score is not None else s for s in rec.scored]
    return dataclasses.replace(rec, scored=scored)


@dataclass(frozen=True)
class _FrameVad:
    """The endpointer's `last_voiced_ns()`, `silence_ms()` and `quiet_ms()` after each frame of a clip."""

    last_voiced_ns: list[int]
    silence_ms: list[float]
    quiet_ms: list[float]


def _vad_by_frame(clip: Clip) -> _FrameVad:
    """`_FrameVad` of the clip (a first pass of Silero): what the session knows when a partial returns."""
    endpointer = Endpointer(VadOptions(end_silence_ms=NEVER_MS), model=load_silero())
    vad = _FrameVad([], [], [])
    for i, frame in enumerate(frames(_audio(clip.path))):
        endpointer.push(frame, i * FRAME_NS)
        vad.last_voiced_ns.append(endpointer.last_voiced_ns())
        vad.silence_ms.append(endpointer.silence_ms())
        vad.quiet_ms.append(endpointer.quiet_ms())
    return vad


@functools.lru_cache(maxsize=256)
def _audio(path: str) -> np.ndarray:
    return read_wav(path)


@dataclass(frozen=True)
class TurnEnd:
    """Where a policy ended the clip's first turn (None: it never did, or speech never started)."""

    speech_start_ns: int | None
    end_ns: int | None  # the speech_end's confirmed_ns


def replay(rec: Recording, policy: TurnTakingOptions | int) -> TurnEnd:
    """The first turn end under `policy`: a fixed silence in ms, or the score-driven wait."""
    fixed = policy if isinstance(policy, int) else NEVER_MS
    endpointer = Endpointer(VadOptions(end_silence_ms=fixed), model=_ReplayVad(rec.probabilities))  # type: ignore[arg-type]
    wait = None if isinstance(policy, int) else EndOfTurnWait(policy)
    options = policy if isinstance(policy, TurnTakingOptions) else TurnTakingOptions()
    pending = sorted(rec.scored, key=lambda s: s.known_under(options))
    start_ns, n_known = None, 0
    for i, frame in enumerate(frames(_audio(rec.clip.path))):
        t = i * FRAME_NS
        while wait is not None and n_known < len(pending) and pending[n_known].known_under(options) <= t:
            known = pending[n_known]
            if known.skipped:  # as the session: these are not scored
                pass
            elif known.text.strip():
                wait.scored(known.score, known.heard_until_ns, known.text, audio_score=known.audio_score,
                            confidence=known.confidence)  # fmt: skip
            else:
                wait.heard_no_words(known.heard_until_ns)
            n_known += 1
        if wait is not None and endpointer.speaking():  # as `ScoredEndpointing.before_frame`
            scoring = any(s.heard_until_ns - FRAME_NS < t < s.known_under(options) for s in pending)
            ms = wait.wait_ms(endpointer.last_loud_ns(), scoring=scoring)
            endpointer.set_end_silence_ms(ms, from_quiet=ms <= wait.options.complete_silence_ms)
        for edge in endpointer.push(frame, t):
            if edge.kind == "speech_start" and start_ns is None:
                start_ns = edge.t_ns
            elif edge.kind == "speech_end":
                return TurnEnd(start_ns, edge.confirmed_ns)
    return TurnEnd(start_ns, None)
