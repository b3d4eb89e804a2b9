"""The session with fake stages: a whole turn, barge-in, echo guard, and failures that end only a turn."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from tests.fakes import (
    FakeClock,
    FakeEndpointer,
    FakeLLM,
    FakeProposingLLM,
    FakeRecognizer,
    FakeSynthesizer,
    FakeTranscript,
    HeldRecognizer,
    StoppableFakeRecognizer,
    WordChunker,
)
from voiceagent.cpu_lane import NO_LANE, CpuLane
from voiceagent.events import (
    Event,
    Interrupted,
    ReplyText,
    SpeechAudio,
    SpeechEnded,
    TranscriptFinal,
    TranscriptPartial,
    TurnEnded,
    TurnError,
)
from voiceagent.partials import words_ahead
from voiceagent.session import Session, SessionOptions
from voiceagent.stages import FINAL_MARGIN_S, TurnAudioModel
from voiceagent.trace import Trace, turn_latencies_ms

LOUD = np.full(320, 5000, dtype=np.int16)
ECHO = np.full(320, 2000, dtype=np.int16)  # above the plain threshold, below the guarded one
QUIET = np.zeros(320, dtype=np.int16)


class Harness:
    """A session on fakes plus a transport that plays audio only when told to."""

    def __init__(
        self,
        llm: FakeLLM | None = None,
        recognizer: FakeRecognizer | None = None,
        synthesizer: FakeSynthesizer | None = None,
        options: SessionOptions | None = None,
        lane: CpuLane = NO_LANE,
        turn_audio: TurnAudioModel | None = None,
    ) -> None:
        self.clock = FakeClock()
        self.trace = Trace(None, "test", self.clock)
        self.llm = llm or FakeLLM()
        self.recognizer = recognizer or FakeRecognizer()
        self.synthesizer = synthesizer or FakeSynthesizer()
        self.session = Session(
            endpointer=FakeEndpointer(),
            recognizer=self.recognizer,
            llm=self.llm,
            synthesizer=self.synthesizer,
            new_chunker=WordChunker,
            clock=self.clock,
            trace=self.trace,
            options=options,
            lane=lane,
            turn_audio=turn_audio,
        )
        self.events: list[Event] = []
        self.queued: dict[int, int] = {}  # turn -> samples received
        self.played: dict[int, int] = {}

    async def collect(self) -> None:
        async for event in self.session.events():
            self.events.append(event)
            if isinstance(event, SpeechAudio):
                self.session.audio_sent(event)
                self.queued[event.turn_id] = self.queued.get(event.turn_id, 0) + len(event.samples)

    async def frames(self, frame: np.ndarray, n: int) -> None:
        for _ in range(n):
            # What the last wake-ups started runs before time moves on: a thread's result (an ASR final)
            # may land in the same turn of the event loop as this loop's wake-up, before or after it,
            # and the task it starts (a reply's speaker) runs a turn later; two yields cover both orders.
            for _ in range(2):
                await asyncio.sleep(0)
            self.clock.advance(0.02)
            await self.session.push_audio(frame)
            await asyncio.sleep(0.001)  # let worker threads and tasks run

    def play(self, turn: int, samples: int | None = None) -> None:
        self.played[turn] = self.queued.get(turn, 0) if samples is None else samples
        self.session.audio_played(turn, self.played[turn])

    async def settle(self, until: Callable[[], bool], timeout_s: float = 5.0) -> None:
        for _ in range(int(timeout_s / 0.01)):
            if until():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"timed out; events: {[type(e).__name__ for e in self.events]}")

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def run(test: Callable[[Harness], Awaitable[None]], **kwargs: Any) -> Harness:
    harness = Harness(**kwargs)

    async def main() -> None:
        collector = asyncio.create_task(harness.collect())
        await test(harness)
        await harness.session.close()
        await collector

    asyncio.run(main())
    return harness


async def one_turn(h: Harness) -> None:
    await h.frames(LOUD, 40)
    await h.frames(QUIET, 12)
    await h.settle(lambda: bool(h.of(TurnEnded)))
    h.play(1)


def test_a_whole_turn() -> None:
    h = run(one_turn)
    assert [e.text for e in h.of(TranscriptFinal)] == ["hello there"]
    assert h.of(TranscriptPartial) and h.of(TranscriptPartial)[-1].text.startswith("hello")
    assert "".join(e.text for e in h.of(ReplyText)) == "Hi, nice to meet you."
    assert h.of(ReplyText)[0].first and h.of(ReplyText)[0].n_accepted == 2
    assert h.synthesizer.spoken == ["Hi,", "nice", "to", "meet", "you."]  # committed text only, in order
    assert h.session.history[1:] == [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "Hi, nice to meet you."},
    ]
    events = [r["event"] for r in h.trace.records]
    for name in (
        "vad.speech_start",
        "vad.speech_end",
        "asr.final",
        "llm.first_block",
        "llm.block",
        "tts.first_audio",
        "out.first_audio",
        "out.played",
        "turn.end",
    ):
        assert name in events, name
    assert events.index("vad.speech_end") < events.index("asr.final") < events.index("llm.first_block")
    latencies = turn_latencies_ms(h.trace.records, 1)
    assert all(value is not None and value >= 0 for value in latencies.values()), latencies


def test_barge_in_cuts_the_reply_to_what_was_heard() -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 12)
        await h.settle(lambda: len(h.of(SpeechAudio)) >= 3)
        h.play(1, 2 * 1600)  # two words (100 ms each at 16 kHz) heard
        await h.frames(LOUD, 30)  # the user talks over the agent
        await h.frames(QUIET, 12)
        await h.settle(lambda: len(h.of(TurnEnded)) == 1 and h.of(TurnEnded)[0].turn_id == 2)
        h.play(2)

    llm = FakeLLM(blocks=["One", " two", " three", " four", " five", " six."], delay_s=0.02)
    h = run(scenario, llm=llm)
    interrupted = h.of(Interrupted)
    assert len(interrupted) == 1 and interrupted[0].turn_id == 1 and interrupted[0].spoken_text == "One two"
    # the second reply saw a history holding only the words the user heard of the first
    assert llm.histories[1][1:] == [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "One two"},
        {"role": "user", "content": "hello there"},
    ]
    # no output of turn 1 reached the transport after the interruption
    cut = h.events.index(interrupted[0])
    assert all(
        getattr(e, "turn_id", 0) != 1 for e in h.events[cut:] if isinstance(e, SpeechAudio | ReplyText)
    )


def test_echo_guard_keeps_the_agent_from_interrupting_itself() -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(SpeechAudio)))
        await h.frames(ECHO, 20)  # the agent's own voice coming back down the line
        await h.settle(lambda: bool(h.of(TurnEnded)))
        h.play(1)

    h = run(scenario, llm=FakeLLM(delay_s=0.01), options=SessionOptions(echo_guard=True))
    assert not h.of(Interrupted) and len(h.of(TranscriptFinal)) == 1


@pytest.mark.parametrize(
    ("stage", "kwargs"),
    [
        ("llm", {"llm": FakeLLM(error_after=2)}),
        ("asr", {"recognizer": FakeRecognizer(error=RuntimeError("decoder crashed"))}),
        ("tts", {"synthesizer": FakeSynthesizer(error=OSError("voice missing"))}),
    ],
)
def test_a_failing_stage_ends_only_its_turn(stage: str, kwargs: dict[str, Any]) -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnError)))
        # repair the stage, then the next turn works
        h.llm.error_after, h.recognizer.error, h.synthesizer.error = None, None, None
        await h.frames(LOUD, 30)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))
        h.play(2)

    h = run(scenario, **kwargs)
    errors = h.of(TurnError)
    assert len(errors) == 1 and errors[0].stage == stage and errors[0].turn_id == 1
    assert h.of(TurnEnded)[0].turn_id == 2 and h.of(TurnEnded)[0].reason == "done"
    assert any(r["event"] == "turn.error" and r["stage"] == stage for r in h.trace.records)


def test_typed_input_gets_a_spoken_reply() -> None:
    async def scenario(h: Harness) -> None:
        await h.session.push_text("what time is it")
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario)
    assert h.session.history[1] == {"role": "user", "content": "what time is it"}
    assert h.of(SpeechAudio)


def test_bad_frames_are_refused_and_the_session_goes_on() -> None:
    async def scenario(h: Harness) -> None:
        for bad in (np.zeros(160, dtype=np.int16), np.zeros(320, dtype=np.float32)):
            with pytest.raises(ValueError, match=r"audio frames must be \[320\] int16"):
                await h.session.push_audio(bad)
        await one_turn(h)

    assert run(scenario).of(TurnEnded)


def sent_phrases(h: Harness) -> list[str]:
    """The phrases whose audio went out, in order (FakeSynthesizer: one chunk per word)."""
    return [e.phrase for e in h.of(SpeechAudio)]


def _events(h: Harness) -> list[str]:
    return [r["event"] for r in h.trace.records]


def _record(h: Harness, name: str) -> dict[str, Any]:
    return next(r for r in h.trace.records if r["event"] == name)


def test_the_reply_starts_when_the_user_pauses_and_is_kept_at_speech_end() -> None:
    h = run(one_turn)
    events = _events(h)
    assert events.index("llm.preemptive_start") < events.index("vad.speech_end") < events.index("asr.final")
    assert _record(h, "llm.preemptive_start")["text"] == "hello there"
    assert len(h.llm.histories) == 1  # the preemptive reply was adopted, not asked for again
    assert _record(h, "llm.first_block")["preemptive"] is True
    assert "".join(e.text for e in h.of(ReplyText)) == "Hi, nice to meet you."
    assert h.synthesizer.spoken == ["Hi,", "nice", "to", "meet", "you."]
    assert events.index("asr.final") < events.index("llm.first_block")  # nothing spoken before the end


def test_speaking_on_after_a_pause_drops_the_preemptive_reply() -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 40)
        await h.frames(QUIET, 6)  # a pause: the reply starts on "hello there"
        await h.settle(lambda: "llm.preemptive_start" in _events(h))
        await h.frames(LOUD, 20)  # ... but the user goes on
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario)
    cancelled = [r for r in h.trace.records if r["event"] == "llm.preemptive_cancel"]
    assert [r["reason"] for r in cancelled] == ["speech resumed"]
    assert len(h.of(TurnEnded)) == 1 and len(h.of(TranscriptFinal)) == 1
    assert sent_phrases(h) == ["Hi,", "nice", "to", "meet", "you."]  # one reply, spoken once


def test_the_quiet_tail_starts_the_pause_partial_and_the_reply_before_silero_hears_silence() -> None:
    """With `pause_quiet_ms`, the pause partial starts once the audio has been quiet that long, while the
    endpointer's silence (Silero's, here 5 frames behind) still reads 0; the reply it starts is not taken
    for stale ("speech resumed") while the audio stays quiet, and is kept at speech_end."""

    async def scenario(h: Harness) -> None:
        h.session.endpointer.silence_lag_frames = 5  # type: ignore[attr-defined]
        await h.frames(LOUD, 40)
        await h.frames(QUIET, 3)  # 60 ms quiet, no silence yet
        assert h.session.endpointer.silence_ms() == 0.0
        await h.settle(lambda: "llm.preemptive_start" in _events(h))
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    options = SessionOptions(pause_quiet_ms=40, late_pause_ms=0)
    h = run(scenario, options=options)
    partials = [r for r in h.trace.records if r["event"] == "asr.partial"]
    assert partials[-1]["pause"] is True
    assert "llm.preemptive_cancel" not in _events(h)
    assert _record(h, "llm.first_block")["preemptive"] is True
    assert len(h.of(TurnEnded)) == 1 and len(h.llm.histories) == 1


def test_a_final_transcript_that_differs_restarts_the_reply() -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 20)  # the fake hears one word per 10 frames: the pause partial has two
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario, recognizer=FakeRecognizer("what is the weather like"))
    assert _record(h, "llm.preemptive_start")["text"] == "what is"
    assert _record(h, "llm.preemptive_cancel")["reason"] == "the final transcript differs"
    assert h.llm.histories[-1][-1] == {"role": "user", "content": "what is the weather like"}
    assert _record(h, "llm.first_block")["preemptive"] is False
    assert len(h.of(TurnEnded)) == 1


def test_a_reply_to_changed_words_is_proposed_to_the_next_one() -> None:
    """The cancelled preemptive reply's ids go to the LLM with the final words, to be verified again."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    llm = FakeProposingLLM()
    h = run(scenario, llm=llm, recognizer=FakeRecognizer("what is the weather like"))
    cancel = _record(h, "llm.preemptive_cancel")
    assert cancel["reason"] == "the final transcript differs" and cancel["proposed"] >= 1
    assert llm.proposals[0] == [] and llm.proposals[-1] == list(range(1, cancel["proposed"] + 1))
    assert _record(h, "llm.proposal_kept")["kept"] == cancel["proposed"]
    assert h.llm.histories[-1][-1] == {"role": "user", "content": "what is the weather like"}
    assert len(h.of(TurnEnded)) == 1


def test_preemptive_replies_can_be_turned_off() -> None:
    h = run(one_turn, options=SessionOptions(preemptive_reply=False))
    assert "llm.preemptive_start" not in _events(h)
    assert _record(h, "llm.first_block")["preemptive"] is False
    assert "".join(e.text for e in h.of(ReplyText)) == "Hi, nice to meet you."


def test_the_draft_is_fed_the_stable_words_while_the_user_speaks() -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 60)  # partials every 300 ms; the fake's stable words grow by one per 10 frames
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario, recognizer=FakeRecognizer("please tell me the time now"))
    assert h.llm.prefills, "no prefill while speaking"
    users = [messages[-1]["content"] for messages, _ in h.llm.prefills]
    assert all(draft_only for _, draft_only in h.llm.prefills)
    assert users == sorted(users, key=len) and "please tell me the time now".startswith(users[-1])
    assert all(m[:-1] == h.session.history[:1] for m, _ in h.llm.prefills)  # the history, then the words


def test_the_words_fed_while_the_user_speaks_run_ahead_of_the_stable_ones() -> None:
    """The recogniser's guess runs 2-5 words past its stable words; all but its last word (cut off by the
    audio's end) are fed, so fewer ids are left to prefill when the reply starts."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 60)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario, recognizer=FakeRecognizer("please tell me the time now", stable_lag=3))
    fed = [messages[-1]["content"] for messages, _ in h.llm.prefills]
    assert fed and all("please tell me the time now".startswith(words) for words in fed), fed
    # The first partial with words to feed heard 3: none stable yet, and two are fed (the stable words: one
    # partial later, one word).
    assert fed[0] == "please tell", fed


def test_words_that_differ_from_an_earlier_guess_are_fed_though_fewer() -> None:
    """The recogniser's guess ran past the words and was wrong ("how many days are you going to take");
    the next partials' words are fewer or as many, but differ: they are fed, so the draft has the real
    words when the reply starts (counting words fed none of them)."""

    class Guessing(FakeRecognizer):
        partials = [
            ("how", "how many days are you going to take"),
            ("how many days are", "how many days are there in a"),
            ("how many days are there in", "how many days are there in a leap"),
            ("how many days are there in a", "how many days are there in a leap"),
        ]

        def decode_partial(self) -> FakeTranscript:
            stable, text = self.partials[min(self.frames // 16, len(self.partials) - 1)]
            return FakeTranscript(stable, text)

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 64)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario, recognizer=Guessing("how many days are there in a leap year"))
    fed = [messages[-1]["content"] for messages, _ in h.llm.prefills]
    assert fed[0] == "how many days are you going to", fed
    assert "how many days are there in" in fed and "how many days are there in a" in fed, fed
    assert len(fed) == len(set(fed))  # the same words are not fed twice


@pytest.mark.parametrize(
    ("stable", "text", "ahead"),
    [
        ("what is", "what is the capital of fra", "what is the capital of"),
        ("what is", "what is the", "what is"),  # the guess's one word past them: cut off, not fed
        ("call me back", "call me back on zero,", "call me back on"),
        ("pack a toothbrush,", "pack a toothbrush, a towel, and", "pack a toothbrush, a towel"),
        ("how far", "How far away is", "how far"),  # a guess that rewrote the stable words
        ("", "", ""),
    ],
)
def test_words_ahead(stable: str, text: str, ahead: str) -> None:
    assert words_ahead(stable, text) == ahead


@pytest.mark.parametrize("quiet_frames", [0, 1])
def test_no_stable_words_are_fed_once_the_user_has_gone_quiet(quiet_frames: int) -> None:
    """A partial that returns while the user still speaks feeds its stable words; one that returns after
    they went quiet does not: the pause partial is near, and a forward then would hold up its score."""

    async def scenario(h: Harness) -> None:
        assert isinstance(h.recognizer, HeldRecognizer)
        await h.frames(LOUD, 16)  # the first partial starts at 300 ms and is held there
        await h.settle(lambda: h.recognizer.calls >= 1)
        await h.frames(LOUD, 10)  # more words: that partial has not heard them all
        await h.frames(QUIET, quiet_frames)
        h.recognizer.release.set()
        await h.settle(lambda: bool(h.of(TranscriptPartial)))
        await asyncio.sleep(0.05)

    h = run(scenario, recognizer=HeldRecognizer("please tell me the time now"))
    assert h.of(TranscriptPartial)[0].stable  # it had stable words to feed
    assert bool(h.llm.prefills) == (quiet_frames == 0)


def test_a_partial_that_heard_every_word_stands_in_for_the_pause_partial() -> None:
    """A partial begun in the last voiced frames returns in the silence having heard every word: the reply
    starts on it, no pause partial decodes the same words again beside that reply's prefill, and the final
    is told that everything after that partial's audio holds no words, so that it reuses it."""

    async def scenario(h: Harness) -> None:
        assert isinstance(h.recognizer, HeldRecognizer)
        await h.frames(LOUD, 16)  # the partial starts in the last loud frame
        await h.settle(lambda: h.recognizer.calls >= 1)
        await h.frames(QUIET, 3)  # 60 ms of silence: it returns in the pause, having heard every word
        h.recognizer.release.set()
        await h.settle(lambda: "llm.preemptive_start" in _events(h))
        await h.frames(QUIET, 12)  # past pause_ms and the end of speech
        await h.settle(lambda: bool(h.of(TurnEnded)))

    # Without the late pause partial (due at 128 ms, before this fake endpointer's 200 ms end of speech).
    h = run(scenario, recognizer=HeldRecognizer("hello"), options=SessionOptions(late_pause_ms=0))
    assert h.recognizer.calls == 1, "a pause partial decoded the same words again"
    assert _record(h, "llm.first_block")["preemptive"] is True  # the reply begun on it was kept
    # It heard up to the end of the last loud frame (340 ms); the 10th quiet frame confirmed the end (540).
    heard_until_ms, confirmed_end_ms = 340, 540
    margin_ms = 1000 * FINAL_MARGIN_S
    assert h.recognizer.trailing_ms == [pytest.approx(confirmed_end_ms - heard_until_ms + margin_ms)]
    final = _record(h, "asr.final")
    assert final["stood_in"] is True and final["ms"] >= 0.0  # the trace says it was told to reuse it
    assert _record(h, "asr.partial")["ms"] >= 0.0  # and how long the partial's decode took


@pytest.mark.parametrize("spoke_on", [True, False])
def test_a_partial_that_could_not_end_the_turn_is_stopped_when_the_pause_partial_falls_due(
    spoke_on: bool,
) -> None:
    """A regular partial still decoding when the pause partial falls due: stopped if the user spoke on past
    its audio (its words could not end the turn; the pause partial would wait for it), so the pause partial
    decodes at once; left to finish if it heard every word (it stands in for the pause partial)."""

    async def scenario(h: Harness) -> None:
        recognizer = h.recognizer
        assert isinstance(recognizer, StoppableFakeRecognizer)
        await h.frames(LOUD, 16)  # the first partial starts at 300 ms and is held there
        await h.settle(lambda: recognizer.calls >= 1)
        if spoke_on:
            await h.frames(LOUD, 10)  # words that partial has not heard
        await h.frames(QUIET, 3)  # 40 ms of silence: the pause partial is due
        if spoke_on:
            await h.settle(lambda: recognizer.stopped == 1)
            await h.frames(QUIET, 1)  # the next frame starts the pause partial
            await h.settle(lambda: recognizer.calls == 2)
        recognizer.release.set()
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    text = "please tell me the time now"
    h = run(scenario, recognizer=StoppableFakeRecognizer(text), options=SessionOptions(late_pause_ms=0))
    stopped = [r for r in h.trace.records if r["event"] == "asr.partial_stopped"]
    assert h.recognizer.stopped == len(stopped) == (1 if spoke_on else 0)
    assert h.recognizer.calls == (2 if spoke_on else 1)
    if spoke_on:  # it had heard up to the end of the 16th frame (the fake clock starts at 1 s)
        assert stopped[0]["heard_until_ns"] == 1_340_000_000
        # the only partial out is the pause partial's, begun at once (30 frames heard: one word per 10)
        assert [e.text for e in h.of(TranscriptPartial)] == ["please tell me"]
    assert [e.text for e in h.of(TranscriptFinal)] == [text]


class TimedLLM(FakeLLM):
    """One block that says where its time went, as the in-process engine's do."""

    async def stream(self, messages: Any, options: Any = None) -> Any:
        from voiceagent.llm_types import BlockCost, ReplyBlock

        yield ReplyBlock("Hi.", 1, 2, 1, "stop", timing=BlockCost(3.5, 61.2, 12.4, 47.9, 8.0))


def test_the_trace_says_where_a_blocks_time_went() -> None:
    h = run(one_turn, llm=TimedLLM())
    block = _record(h, "llm.block")
    assert (block["waited_ms"], block["engine_ms"], block["draft_ms"], block["verify_ms"]) == (
        3.5,
        61.2,
        12.4,
        47.9,
    )
    assert block["held_ms"] == 8.0


class SlowToStop(FakeLLM):
    """Writes one block, then waits; when cancelled it takes 50 ms to clean up."""

    async def stream(self, messages: Any, options: Any = None) -> Any:
        from voiceagent.llm import ReplyBlock

        try:
            yield ReplyBlock(text="Hi", n_tokens=1, n_drafted=1, n_accepted=1)
            await asyncio.sleep(10)
        finally:
            await asyncio.shield(asyncio.sleep(0.05))


def test_a_cancelled_close_still_closes_and_passes_the_cancellation_on() -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 40)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(ReplyText)))
        closing = asyncio.create_task(h.session.close())
        await asyncio.sleep(0.01)  # close() now awaits the reply's 50 ms clean-up
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing

    run(scenario, llm=SlowToStop(), options=SessionOptions(preemptive_reply=False))  # the reply owns it


def _first_phrase_rendered(h: Harness) -> bool:
    """The running preemptive reply's first phrase has all its audio (the render thread has finished and
    its result reached the event loop), so nothing about it is left to wait for at the end of speech."""
    reply = h.session.preemption.reply
    ahead = reply.spoken_ahead if reply is not None else None
    return ahead is not None and ahead.audio.done()


def test_a_kept_reply_s_first_phrase_is_rendered_before_the_end_of_speech() -> None:
    """A long endpoint wait: the preemptive reply makes its first phrase and TTS renders it meanwhile; at
    speech_end that audio goes out at once, the same samples a synthesis then would have made."""

    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 6)  # the pause: the reply starts on "hello there"
        await h.settle(lambda: _first_phrase_rendered(h))  # its audio made, not only begun
        await h.frames(QUIET, 12)  # the endpointer's wait ends
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario)
    events = _events(h)
    assert h.synthesizer.spoken[0] == "Hi," and events.index("llm.preemptive_start") < events.index(
        "vad.speech_end"
    )
    first = _record(h, "tts.first_audio")
    assert first["ahead"] is True and first["phrase"] == "Hi,"
    assert sent_phrases(h) == ["Hi,", "nice", "to", "meet", "you."]
    assert h.synthesizer.spoken == ["Hi,", "nice", "to", "meet", "you."]  # each phrase rendered once
    expected = FakeSynthesizer().synthesize("Hi,")
    assert np.array_equal(h.of(SpeechAudio)[0].samples, next(expected))
    # the audio went out with the first block, not a synthesis later
    audio_t = h.of(SpeechAudio)[0].t_ns
    assert audio_t == next(e.t_ns for e in h.of(ReplyText))


def test_a_dropped_reply_s_rendering_is_never_sent() -> None:
    async def scenario(h: Harness) -> None:
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 12)
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario, recognizer=FakeRecognizer("what is the weather like"))
    assert _record(h, "llm.preemptive_cancel")["reason"] == "the final transcript differs"
    assert sent_phrases(h) == ["Hi,", "nice", "to", "meet", "you."]  # the new reply's, once
    assert _record(h, "tts.first_audio")["ahead"] is False


def test_speaking_ahead_can_be_turned_off() -> None:
    h = run(one_turn, options=SessionOptions(speak_ahead=False))
    assert _record(h, "tts.first_audio")["ahead"] is False
    assert sent_phrases(h) == ["Hi,", "nice", "to", "meet", "you."]


class SlowFinalRecognizer(FakeRecognizer):
    """Its final waits until `release` is set, then records how many frames it was given by then."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.release = threading.Event()
        self.frames_at_final: list[int] = []

    def decode_final(self, trailing_silence_ms: float = 0.0) -> str:
        self.release.wait(5)
        self.frames_at_final.append(self.frames)
        return super().decode_final(trailing_silence_ms)


def test_frames_after_the_end_of_speech_wait_while_the_final_is_pending() -> None:
    """The final is told how much of its audio is the silence after the words; audio that arrives while it
    waits (for a partial still decoding, or for the cores) must not lengthen that audio, or the final cuts
    off the last words. Those frames reach the recogniser once the final has its audio."""

    async def scenario(h: Harness) -> None:
        assert isinstance(h.recognizer, SlowFinalRecognizer)
        await h.frames(LOUD, 20)
        await h.frames(QUIET, 10)  # the 10th quiet frame confirms the end of speech
        await h.settle(lambda: bool(h.of(SpeechEnded)))
        await h.frames(QUIET, 15)  # 300 ms more while the final waits
        h.recognizer.release.set()
        await h.settle(lambda: bool(h.of(TurnEnded)))

    h = run(scenario, recognizer=SlowFinalRecognizer("hello there"))
    # Frames since start() (the first loud frame came before it), up to the one that confirmed the end.
    assert h.recognizer.frames_at_final == [19 + 10]
    assert h.recognizer.trailing_ms == [pytest.approx(200.0)]  # the 10 quiet frames
    # The trace says how long the final took: the 15 frames (300 ms on the fake clock) it waited.
    assert _record(h, "asr.final")["ms"] == pytest.approx(300.0)
    assert h.recognizer.frames == 19 + 10 + 15  # the held frames followed
