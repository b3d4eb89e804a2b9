"""The trace's own figures (TurnTimes, fed as records are written) and a session opened with its trace."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.fakes import FakeClock, FakePipeline
from voiceagent.events import TurnEnded
from voiceagent.session import SessionOptions
from voiceagent.trace import (
    ASR_FINAL,
    LLM_FIRST_BLOCK,
    OUT_FIRST_AUDIO,
    SESSION_END,
    SESSION_START,
    TTS_FIRST_AUDIO,
    VAD_SPEECH_END,
    Trace,
    TurnTimes,
    turn_latencies_ms,
)
from voiceagent.traced import traced_session


def test_turn_times_are_timed_from_the_end_of_speech_as_records_are_written() -> None:
    clock, times = FakeClock(start_ns=0), TurnTimes()
    trace = Trace(None, "s", clock, observers=[times.observe])
    trace.write(VAD_SPEECH_END, 1, t_ns=100_000_000, confirmed_ns=400_000_000)
    for event, at_ms in (
        (ASR_FINAL, 450),
        (LLM_FIRST_BLOCK, 600),
        (LLM_FIRST_BLOCK, 900),
        (OUT_FIRST_AUDIO, 700),
    ):
        trace.write(event, 1, t_ns=at_ms * 1_000_000, text="hi")
    expected = {"asr_final": 350.0, "first_block": 500.0, "tts_first_audio": None, "voice_to_voice": 600.0}
    assert times.latencies_ms(1) == expected == turn_latencies_ms(trace.records, 1)
    assert not times.typed(1) and times.turns_with_words() == [1]
    assert times.latencies_ms(2) == dict.fromkeys(expected)  # a turn it never saw: nothing timed


def test_a_typed_turn_is_timed_from_its_message() -> None:
    clock, times = FakeClock(start_ns=0), TurnTimes()
    trace = Trace(None, "s", clock, observers=[times.observe])
    trace.write(ASR_FINAL, 3, t_ns=1_000_000_000, text="hello", typed=True)
    trace.write(LLM_FIRST_BLOCK, 3, t_ns=1_200_000_000, preemptive=False)
    trace.write(TTS_FIRST_AUDIO, 3, t_ns=1_250_000_000)
    assert times.typed(3) and not times.any_preemptive()
    assert times.latencies_ms(3) == dict.fromkeys(times.latencies_ms(3))  # no end of speech
    assert times.latencies_from_typing_ms(3) == {
        "asr_final": 0.0,
        "first_block": 200.0,
        "tts_first_audio": 250.0,
        "voice_to_voice": None,
    }


def test_a_traced_session_starts_and_ends_its_trace_file(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"

    async def scenario() -> None:
        options = SessionOptions(output_rate=8000)
        async with traced_session(FakePipeline(), "test", FakeClock(), options, trace_path=path) as traced:
            await traced.session.push_text("hello")
            async for event in traced.session.events():
                if isinstance(event, TurnEnded):
                    break
            assert traced.times.typed(1)

    asyncio.run(scenario())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert (records[0]["event"], records[0]["transport"], records[0]["output_rate"]) == (
        SESSION_START,
        "test",
        8000,
    )
    assert (records[-1]["event"], records[-1]["turn"]) == (SESSION_END, 1)


def test_a_session_that_cannot_be_made_leaves_its_trace_closed(tmp_path: Path) -> None:
    class Broken(FakePipeline):
        def new_session(self, clock: object, trace: object, options: object = None) -> object:
            self.trace = trace
            raise RuntimeError("no models")

    async def scenario() -> None:
        async with traced_session(pipeline, "test", FakeClock(), trace_path=tmp_path / "s.jsonl"):
            raise AssertionError("opened")

    pipeline = Broken()
    with pytest.raises(RuntimeError, match="no models"):
        asyncio.run(scenario())
    assert pipeline.trace._file is None and (tmp_path / "s.jsonl").read_text() == ""
