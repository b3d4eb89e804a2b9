"""False interruptions recover (issue 14, part 4): speech over the reply holds it; a backchannel, a cough or
silence resumes it where it paused, with the history unchanged; real words still cut it (fake stages)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes import FakeLLM, FakeRecognizer, FakeTranscript
from tests.voiceagent.test_session import LOUD, QUIET, Harness, run
from voiceagent.barge_in import interrupts, is_backchannel
from voiceagent.events import (
    Interrupted,
    ReplyPaused,
    ReplyResumed,
    SpeechAudio,
    TranscriptFinal,
    TurnEnded,
)
from voiceagent.recognizers import SplitRecognizer
from voiceagent.session import SessionOptions

REPLY = ["One", " two", " three", " four", " five", " six."]


class ScriptedRecognizer(FakeRecognizer):
    """Hears `texts[i]` in the i-th utterance (one word per 10 frames pushed, as FakeRecognizer)."""

    def __init__(self, *texts: str) -> None:
        super().__init__(texts[0])
        self.texts = list(texts)

    def start(self) -> None:
        super().start()
        self.text = self.texts[min(self.utterances, len(self.texts)) - 1]

    def decode_partial(self) -> FakeTranscript:
        return super().decode_partial() if self.text else FakeTranscript("", "")


class MisreadingRecognizer(ScriptedRecognizer):
    """As ScriptedRecognizer, but its partials of the second utterance read `partial` whatever was said."""

    def __init__(self, first: str, partial: str, final: str) -> None:
        super().__init__(first, final)
        self.partial = partial

    def decode_partial(self) -> FakeTranscript:
        if self.utterances < 2 or not self.frames:
            return super().decode_partial()
        return FakeTranscript("", self.partial)


def speak_over(words_frames: int, then_quiet: int = 12) -> Any:
    """The user asks, hears two words of the reply, then makes `words_frames` of sound over it."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 12)
        await h.settle(lambda: len(h.of(SpeechAudio)) >= 2)
        h.play(1, 2 * 1600)  # two words heard
        await h.frames(LOUD, words_frames)
        await h.frames(QUIET, then_quiet)
        await h.settle(lambda: bool(h.of(TurnEnded)))
        for turn in list(h.queued):
            h.play(turn)
        await h.settle(lambda: not h.session.replying)

    return scenario


@pytest.mark.parametrize("heard", ["mm-hmm", "Yeah.", "okay", "", "(coughs)"])
def test_a_backchannel_or_a_cough_resumes_the_reply(heard: str) -> None:
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    h = run(speak_over(15), llm=llm, recognizer=ScriptedRecognizer("hello there", heard))
    assert not h.of(Interrupted)
    ended = h.of(TurnEnded)
    assert [e.turn_id for e in ended] == [1] and ended[0].spoken_text == "One two three four five six."
    assert h.session.history[1:] == [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "One two three four five six."},
    ]
    assert len(llm.histories) == 1  # the backchannel was not answered
    paused, resumed = h.of(ReplyPaused), h.of(ReplyResumed)
    assert [e.turn_id for e in paused] == [1] and [e.turn_id for e in resumed] == [1]
    # no audio of the reply reached the transport between the pause and the resume
    between = h.events[h.events.index(paused[0]) : h.events.index(resumed[0])]
    assert not [e for e in between if isinstance(e, SpeechAudio)]
    assert h.synthesizer.spoken == ["One", "two", "three", "four", "five", "six."]


def test_real_words_over_the_reply_still_cut_it_to_what_was_heard() -> None:
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    h = run(speak_over(30), llm=llm, recognizer=ScriptedRecognizer("hello there", "wait what about Tuesday"))
    interrupted = h.of(Interrupted)
    assert len(interrupted) == 1 and interrupted[0].turn_id == 1 and interrupted[0].spoken_text == "One two"
    assert llm.histories[-1][-2:] == [
        {"role": "assistant", "content": "One two"},
        {"role": "user", "content": "wait what about Tuesday"},
    ]


def test_sound_without_words_for_a_second_resumes_the_reply_before_it_ends() -> None:
    """A long cough: the reply goes on after resume_after_ms although the sound has not stopped."""
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    options = SessionOptions(resume_after_ms=400.0)
    h = run(speak_over(40), llm=llm, recognizer=ScriptedRecognizer("hello there", ""), options=options)
    resumed = [r for r in h.trace.records if r["event"] == "turn.resumed"]
    assert resumed and resumed[0]["reason"] == "no words in time"
    speech_end = [r for r in h.trace.records if r["event"] == "vad.speech_end"][-1]
    assert resumed[0]["t_ns"] < speech_end["t_ns"]
    assert not h.of(Interrupted) and h.of(TurnEnded)[0].spoken_text == "One two three four five six."


def test_without_resume_any_speech_over_the_reply_interrupts_it_at_once() -> None:
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    options = SessionOptions(resume_after_ms=None)
    h = run(speak_over(15), llm=llm, recognizer=ScriptedRecognizer("hello there", "mm-hmm"), options=options)
    assert len(h.of(Interrupted)) == 1 and not h.of(ReplyPaused)


@pytest.mark.parametrize(
    ("text", "backchannel"),
    [
        ("Mm-hmm.", True),
        ("yeah, okay", True),
        ("", True),
        ("[coughing]", True),
        ("I see.", True),
        ("N m", True),  # how Whisper heard Piper's "Mm-hmm." (bench/turn_taking)
        ("Mm-mm Mmmm", True),
        ("Uh-uh.", True),
        ("Yeah but what about Tuesday?", False),
        ("stop", False),
        ("What?", False),
    ],
)
def test_what_counts_as_a_backchannel(text: str, backchannel: bool) -> None:
    assert is_backchannel(text) is backchannel


def test_speech_over_the_reply_is_heard_by_the_barge_in_recogniser() -> None:
    """With a SplitRecognizer (Moonshine for turns, Whisper for speech over the reply), a hum that the turns'
    recogniser would hear as words ("In a moment") is heard by the barge-in one as "mm-hmm": it resumes."""
    turns = ScriptedRecognizer("hello there", "In a moment")
    barge_ins = ScriptedRecognizer("mm-hmm")
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    h = run(speak_over(15), llm=llm, recognizer=SplitRecognizer(turns, barge_ins))  # type: ignore[arg-type]
    assert not h.of(Interrupted) and [e.turn_id for e in h.of(ReplyResumed)] == [1]
    assert turns.utterances == 1 and barge_ins.utterances == 1  # the question, then the hum over the reply
    assert h.of(TurnEnded)[0].spoken_text == "One two three four five six."
    assert len(llm.histories) == 1


def test_the_turns_recogniser_hears_the_user_again_after_the_reply() -> None:
    turns, barge_ins = ScriptedRecognizer("hello there", "what time is it"), ScriptedRecognizer("mm-hmm")

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))
        h.play(1)
        await h.settle(lambda: not h.session.replying)
        await h.frames(LOUD, 40)  # a new question, once the reply has played
        await h.frames(QUIET, 12)
        await h.settle(lambda: len(h.of(TurnEnded)) == 2)

    h = run(scenario, recognizer=SplitRecognizer(turns, barge_ins))  # type: ignore[arg-type]
    assert turns.utterances == 2 and barge_ins.utterances == 0
    assert h.llm.histories[-1][-1] == {"role": "user", "content": "what time is it"}


@pytest.mark.parametrize(
    ("text", "final", "cuts"),
    [
        ("in a map", False, False),  # how Whisper heard half of Piper's "Mm-hmm." (bench/turn_taking)
        ("in a map", True, True),
        ("And and", False, False),
        ("Out", False, False),
        ("stop", False, True),
        ("Wait,", False, True),
        ("no no no", False, True),
        ("what about next Tuesday", False, True),
        ("Mm-hmm.", False, False),
        ("Mm-hmm.", True, False),
    ],
)
def test_which_transcripts_end_a_held_reply(text: str, final: bool, cuts: bool) -> None:
    assert interrupts(text, final=final) is cuts


def test_a_hum_misread_as_short_words_waits_for_the_final_and_resumes() -> None:
    """Partials that read a hum as two or three words ("in a map") neither cut the reply nor let the
    timer resume it; the final, with all the audio, hears the hum, and the reply goes on."""
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    recognizer = MisreadingRecognizer("hello there", "in a map", "Mm-hmm.")
    options = SessionOptions(resume_after_ms=500.0)  # shorter than the sound: the timer would resume it
    h = run(speak_over(50), llm=llm, recognizer=recognizer, options=options)
    assert not h.of(Interrupted)
    resumed = [r for r in h.trace.records if r["event"] == "turn.resumed"]
    assert [r["reason"] for r in resumed] == ["backchannel"]  # at the final, not "no words in time"
    assert h.of(TurnEnded)[0].spoken_text == "One two three four five six."
    assert len(llm.histories) == 1


def test_short_real_words_cut_the_reply_at_the_final() -> None:
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    recognizer = MisreadingRecognizer("hello there", "What time", "What time")
    h = run(speak_over(50), llm=llm, recognizer=recognizer, options=SessionOptions(resume_after_ms=500.0))
    assert not h.of(ReplyResumed)
    interrupted = h.of(Interrupted)
    assert len(interrupted) == 1 and interrupted[0].spoken_text == "One two"
    assert h.events.index(interrupted[0]) > h.events.index(h.of(TranscriptFinal)[-1])
    assert llm.histories[-1][-1] == {"role": "user", "content": "What time"}


def test_a_stop_word_cuts_the_reply_before_the_final() -> None:
    llm = FakeLLM(blocks=REPLY, delay_s=0.02)
    recognizer = MisreadingRecognizer("hello there", "Stop", "Stop.")
    h = run(speak_over(30), llm=llm, recognizer=recognizer)
    interrupted = h.of(Interrupted)
    assert len(interrupted) == 1 and interrupted[0].spoken_text == "One two"
    assert h.events.index(interrupted[0]) < h.events.index(h.of(TranscriptFinal)[-1])
