"""The session ends a turn by the end-of-turn score of its partials (fake stages): complete words end it
after a short silence, a sentence paused mid-way is heard as one turn, and without a score the fixed
silence rule holds."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.fakes import FakeLLM, FakeRecognizer, FakeTranscript
from tests.voiceagent.test_session import LOUD, QUIET, Harness, run
from voiceagent.asr import Transcript
from voiceagent.events import SpeechEnded, TranscriptFinal, TurnEnded
from voiceagent.session import SessionOptions
from voiceagent.turn_taking import TurnTakingOptions

TURN_TAKING = TurnTakingOptions(complete_silence_ms=120, incomplete_silence_ms=1500, pending_silence_ms=700)


class VoicedWordsRecognizer(FakeRecognizer):
    """Hears one word of `text` per 10 voiced frames (silence adds none, unlike FakeRecognizer)."""

    def start(self) -> None:
        super().start()
        self.frames = 1  # the voiced frame that started the utterance came just before (its pre-roll)

    def push(self, frame: Any) -> None:
        self.frames += int(np.abs(frame.astype(np.int32)).max() > 1000)

    def decode_partial(self) -> FakeTranscript:
        words = self.text.split()[: self.frames // 10]
        return FakeTranscript(" ".join(words[:-1]), " ".join(words))

    def decode_final(self, trailing_silence_ms: float = 0.0) -> str:
        return " ".join(self.text.split()[: self.frames // 10])


class ScoringLLM(FakeLLM):
    """Scores a user's words as complete when they end with one of `complete_after`; records the calls."""

    def __init__(self, complete_after: Sequence[str] = ("sister", "there")) -> None:
        super().__init__(delay_s=0.01)
        self.complete_after = tuple(complete_after)
        self.scored: list[str] = []
        self.replies_next: list[bool] = []  # per score: whether a reply to its words was to come next

    async def end_of_turn_probability(self, messages: Any, *, reply_next: bool = False) -> float | None:
        words = messages[-1]["content"]
        self.scored.append(words)
        self.replies_next.append(reply_next)
        return 0.9 if words.rstrip(" .?!").endswith(self.complete_after) else 0.0001


def endpoint_wait_ms(h: Harness) -> float:
    ended = h.of(SpeechEnded)[0]
    return (ended.confirmed_ns - ended.t_ns) / 1e6


def ask(voiced: int, quiet: int = 40) -> Any:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, voiced)
        await h.frames(QUIET, quiet)
        await h.settle(lambda: bool(h.of(TurnEnded)))
        h.play(1)

    return scenario


def test_complete_words_end_the_turn_after_a_short_silence() -> None:
    llm = ScoringLLM()
    options = SessionOptions(turn_taking=TURN_TAKING)
    h = run(ask(20), llm=llm, recognizer=VoicedWordsRecognizer("hello there"), options=options)
    assert [e.text for e in h.of(TranscriptFinal)] == ["hello there"]
    assert 100 <= endpoint_wait_ms(h) < 180, endpoint_wait_ms(h)  # the fake's own rule: 180 ms
    scores = [r for r in h.trace.records if r["event"] == "turn.score"]
    assert scores and scores[-1]["score"] == 0.9 and scores[-1]["wait_ms"] == 120
    # The finished sentence's wait counts from where the audio went quiet; the waits before it from
    # Silero's silence (they are budgets for a partial's score and guesses at a pause).
    waits = set(h.session.endpointer.waits)
    assert (120, True) in waits and {quiet for ms, quiet in waits if ms > 120} == {False}


def test_the_score_in_the_pause_is_told_the_reply_comes_next() -> None:
    """The pause partial's score is asked with `reply_next` (the engine's forward then carries the reply's
    prompt and gives its first token), and that reply starts on the very words scored; the scores of
    partials heard while the user speaks are not."""
    llm = ScoringLLM(complete_after=("now",))
    options = SessionOptions(turn_taking=TURN_TAKING)
    recognizer = VoicedWordsRecognizer("what time is it now")  # the last word after the last regular partial
    h = run(ask(55), llm=llm, recognizer=recognizer, options=options)
    starts = [r["text"] for r in h.trace.records if r["event"] == "llm.preemptive_start"]
    told = [words for words, next_ in zip(llm.scored, llm.replies_next, strict=True) if next_]
    assert told and starts and told == starts == ["what time is it now"], (llm.scored, llm.replies_next)
    assert not all(llm.replies_next), "a partial heard while the user spoke was scored as if a reply came"


def test_a_sentence_paused_mid_way_is_heard_as_one_turn() -> None:
    """ "remind me to" ... 0.6 s ... "call my sister": the incomplete words keep the turn open."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 30)  # a 600 ms pause after "to"
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 40)
        await h.settle(lambda: bool(h.of(TurnEnded)))
        h.play(1)

    llm = ScoringLLM()
    recognizer = VoicedWordsRecognizer("remind me to call my sister")
    h = run(scenario, llm=llm, recognizer=recognizer, options=SessionOptions(turn_taking=TURN_TAKING))
    assert [e.text for e in h.of(TranscriptFinal)] == ["remind me to call my sister"]
    assert len(h.of(SpeechEnded)) == 1 and "remind me to" in llm.scored
    assert llm.histories[-1][-1] == {"role": "user", "content": "remind me to call my sister"}


def test_the_same_pause_cuts_the_turn_under_the_silence_rule() -> None:
    """Without a scoring LLM the endpointer keeps its fixed rule and the pause ends the turn: two turns."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 30)
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 40)
        await h.settle(lambda: len(h.of(TurnEnded)) == 2)

    recognizer = VoicedWordsRecognizer("remind me to call my sister")
    h = run(scenario, recognizer=recognizer, options=SessionOptions(turn_taking=TURN_TAKING))
    assert len(h.of(SpeechEnded)) == 2 and not [r for r in h.trace.records if r["event"] == "turn.score"]


def test_turn_taking_off_keeps_the_silence_rule_with_a_scoring_llm() -> None:
    llm = ScoringLLM()
    h = run(
        ask(20),
        llm=llm,
        recognizer=VoicedWordsRecognizer("hello there"),
        options=SessionOptions(turn_taking=None),
    )
    assert endpoint_wait_ms(h) >= 180 and not llm.scored  # the fake endpointer's own 10 frames


class LaggingRecognizer(VoicedWordsRecognizer):
    """As VoicedWordsRecognizer, but a partial returns only after `lag_frames` more frames were pushed: the
    words it heard are those at its start, as a real pass decodes the audio it was given."""

    def __init__(self, text: str, lag_frames: int = 6) -> None:
        super().__init__(text)
        self.lag_frames, self.pushed = lag_frames, 0
        self._pushed = threading.Condition()

    def push(self, frame: Any) -> None:
        super().push(frame)
        with self._pushed:
            self.pushed += 1
            self._pushed.notify_all()

    def decode_partial(self) -> FakeTranscript:
        heard = super().decode_partial()
        with self._pushed:
            until = self.pushed + self.lag_frames
            self._pushed.wait_for(lambda: self.pushed >= until, timeout=5.0)
        return heard


def test_partials_that_did_not_hear_the_end_are_neither_scored_nor_answered() -> None:
    """Partials that return after the user spoke on past their audio leave the LLM free: only the words
    of a partial that heard everything are scored, and the preemptive reply starts on those alone."""
    llm = ScoringLLM()
    recognizer = LaggingRecognizer("could you remind me to call my sister")
    h = run(ask(80), llm=llm, recognizer=recognizer, options=SessionOptions(turn_taking=TURN_TAKING))
    assert [e.text for e in h.of(TranscriptFinal)] == ["could you remind me to call my sister"]
    # Only partials whose audio reached the last voiced frame (within the 80 ms slack) were scored: the
    # last regular one may have ("... call my", 80 ms short), the earlier ones not.
    assert llm.scored and all(len(words.split()) >= 7 for words in llm.scored), llm.scored
    starts = [r["text"] for r in h.trace.records if r["event"] == "llm.preemptive_start"]
    assert starts and all(len(words.split()) >= 7 for words in starts), starts
    partials = [r for r in h.trace.records if r["event"] == "asr.partial"]
    assert len(partials) >= len(llm.scored) + 3  # the regular partials still ran, unscored
    assert endpoint_wait_ms(h) < 700  # the score of the pause partial ended it, not the pending wait


def test_a_pause_before_the_first_word_is_readable_keeps_the_turn_open() -> None:
    """ "Could" ... 0.8 s ... "you call my sister": the pause partials hear too little to read a word, and
    nothing would be answered, so the turn waits as if incomplete instead of the shorter pending wait."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 8)  # under the fake's 10 voiced frames a word
        await h.frames(QUIET, 40)  # 800 ms: longer than the pending wait (700 here)
        await h.frames(LOUD, 50)
        await h.frames(QUIET, 40)
        await h.settle(lambda: bool(h.of(TurnEnded)))
        h.play(1)

    llm = ScoringLLM()
    recognizer = VoicedWordsRecognizer("could you call my sister")
    h = run(scenario, llm=llm, recognizer=recognizer, options=SessionOptions(turn_taking=TURN_TAKING))
    assert len(h.of(SpeechEnded)) == 1, "the pause before the first readable word ended the turn"
    assert [e.text for e in h.of(TranscriptFinal)] == ["could you call my sister"]


def test_a_pause_is_held_while_its_partial_is_still_decoding() -> None:
    """On a loaded CPU a partial can take longer than the pending wait: "remind me to" ... 1 s ... "call
    my sister", each pass returning 40 frames (800 ms) after it began. Until a partial that heard the
    words returns with its score, the pending wait (700 ms here) does not end the turn."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 50)
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 100)
        await h.settle(lambda: bool(h.of(TurnEnded)))
        h.play(1)

    llm = ScoringLLM()
    recognizer = LaggingRecognizer("remind me to call my sister", lag_frames=40)
    h = run(scenario, llm=llm, recognizer=recognizer, options=SessionOptions(turn_taking=TURN_TAKING))
    assert len(h.of(SpeechEnded)) == 1, "the pending wait ended the turn while a partial was decoding"
    assert [e.text for e in h.of(TranscriptFinal)] == ["remind me to call my sister"]


class HeardAudioRecognizer(VoicedWordsRecognizer):
    """As VoicedWordsRecognizer, its partials carrying the audio they heard (as asr.Transcript does)."""

    def decode_partial(self) -> Transcript:  # type: ignore[override]
        heard = super().decode_partial()
        return Transcript(heard.stable, heard.text, np.zeros(320 * self.frames, dtype=np.float32))


class FixedTurnAudio:
    """A Smart Turn stand-in: one probability for any audio; records the audio lengths it heard."""

    def __init__(self, probability: float) -> None:
        self.value, self.heard = probability, []

    def probability(self, audio: np.ndarray) -> float:
        self.heard.append(audio.size)
        return self.value


class DoubtfulLLM(ScoringLLM):
    """Finds "how far away is the moon" unlikely to be finished (0.05), as the draft model does."""

    async def end_of_turn_probability(self, messages: Any, *, reply_next: bool = False) -> float | None:
        self.scored.append(messages[-1]["content"])
        self.replies_next.append(reply_next)
        return 0.05


def wait_with_turn_audio(options: TurnTakingOptions, turn_audio: FixedTurnAudio) -> tuple[float, Harness]:
    harness_options = SessionOptions(turn_taking=options)
    recognizer = HeardAudioRecognizer("how far away is the moon")
    h = run(
        ask(60, quiet=120),
        llm=DoubtfulLLM(),
        recognizer=recognizer,
        options=harness_options,
        turn_audio=turn_audio,
    )
    assert [e.text for e in h.of(TranscriptFinal)] == ["how far away is the moon"]
    return endpoint_wait_ms(h), h


def test_a_falling_voice_ends_doubtful_words_sooner_when_the_audio_is_weighed() -> None:
    weighed = dataclasses.replace(TURN_TAKING, audio_weight=1.0)
    falling = FixedTurnAudio(0.999)
    quick, h = wait_with_turn_audio(weighed, falling)
    assert falling.heard and min(falling.heard) > 0  # each scored partial's audio
    scores = [r for r in h.trace.records if r["event"] == "turn.score"]
    assert scores[-1]["score"] == 0.05 and scores[-1]["audio_score"] == 0.999
    assert (
        scores[-1]["fused"] > weighed.complete_score and scores[-1]["wait_ms"] == weighed.complete_silence_ms
    )
    assert quick < 180, quick
    # The same words and voice under a policy that weighs the words alone: the model is never asked, and
    # the doubtful words wait longer; a voice that did not fall waits longer still.
    unasked = FixedTurnAudio(0.999)
    words_only, h = wait_with_turn_audio(TURN_TAKING, unasked)
    assert not unasked.heard and words_only > quick + 300, (words_only, quick)
    assert all(r["audio_score"] is None for r in h.trace.records if r["event"] == "turn.score")
    level, _ = wait_with_turn_audio(weighed, FixedTurnAudio(0.05))
    assert level > words_only, (level, words_only)
