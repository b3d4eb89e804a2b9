"""Recording a session's audio and replaying it: in-process, through a live gateway's /ws, and as a phone
call to /twilio, on the fake pipeline (tests/fakes.py): fast, no models."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from tests.fakes import FakeClock, FakePipeline, silence
from tests.gateway.helpers import client, fake_app, quiet, running, tone
from voiceagent.audio import FRAME_SAMPLES, SAMPLE_RATE, frames
from voiceagent.replay.analysis import summarize
from voiceagent.replay.drive import replay_local, replay_twilio, replay_ws
from voiceagent.replay.recordings import recordings
from voiceagent.replay.traces import read_trace
from voiceagent.talk import talk
from voiceagent.trace import Trace

TWO_TURNS = np.concatenate([quiet(0.3, 16000), tone(0.6, 16000), quiet(1.2, 16000), tone(0.4, 16000)])


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def firsts(records: list[dict[str, Any]], event: str) -> dict[int, int]:
    found: dict[int, int] = {}
    for r in records:
        if r["event"] == event:
            found.setdefault(r["turn"], r["t_ns"])
    return found


def test_recording_keeps_each_turns_audio_beside_the_trace(tmp_path: Path) -> None:
    clock = FakeClock()
    trace = Trace(tmp_path / "s.jsonl", "s", clock, record_audio=True)
    audio = TWO_TURNS
    for k, frame in enumerate(frames(audio)):
        trace.record_audio(frame, clock.now_ns(), turn=0 if k < 40 else 1)
        clock.advance(0.02)
    clock.advance(1.0)  # the client went quiet: a gap, then more audio of turn 1
    trace.record_audio(np.full(FRAME_SAMPLES, 7, dtype=np.int16), clock.now_ns(), turn=1)
    trace.close()
    records = read_records(tmp_path / "s.jsonl")
    files = [r["file"] for r in records if r["event"] == "rec.audio"]
    assert files == ["s.audio/turn-000-00.wav", "s.audio/turn-001-00.wav", "s.audio/turn-001-01.wav"]
    first, rate = soundfile.read(tmp_path / files[0], dtype="int16")
    assert rate == SAMPLE_RATE and np.array_equal(first, audio[: 40 * FRAME_SAMPLES])
    (session,) = recordings(records, tmp_path / "s.jsonl")
    whole = len(audio) // FRAME_SAMPLES * FRAME_SAMPLES
    assert np.array_equal(session.audio[:whole], audio[:whole])
    gap = session.audio[whole:]  # the second of silence the client did not send, then its last frame
    assert len(gap) == int(1.0 * SAMPLE_RATE) + FRAME_SAMPLES
    assert not gap[: int(1.0 * SAMPLE_RATE)].any() and (gap[-FRAME_SAMPLES:] == 7).all()


def test_a_missing_recording_is_reported_not_fatal(tmp_path: Path) -> None:
    records = [
        {"t_ns": 0, "session": "s", "turn": 0, "stage": "rec", "event": "rec.audio", "file": "s.audio/a.wav"},
        {
            "t_ns": 10**9,
            "session": "s",
            "turn": 1,
            "stage": "rec",
            "event": "rec.audio",
            "file": "s.audio/b.wav",
        },
    ]
    (tmp_path / "s.audio").mkdir()
    soundfile.write(tmp_path / "s.audio/b.wav", np.ones(320, dtype=np.int16), SAMPLE_RATE)
    (session,) = recordings(records, tmp_path / "s.jsonl")
    assert len(session.audio) == SAMPLE_RATE + 320 and session.problems == [
        "session s: recorded audio s.audio/a.wav unreadable ("
        + str(tmp_path / "s.audio/a.wav")
        + " is missing), skipped"
    ]


def recorded_talk(tmp_path: Path) -> Path:
    """A two-turn talk on the fake pipeline, its audio recorded beside the trace."""
    path = tmp_path / "talk.jsonl"
    result = asyncio.run(talk(TWO_TURNS, FakePipeline(), trace_path=path, record_audio=True))
    assert result.transcript == "hello there hello there" and not result.errors
    return path


def test_a_recorded_talk_replays_in_process_with_the_same_turns(tmp_path: Path) -> None:
    path = recorded_talk(tmp_path)
    records = read_records(path)
    (session,) = recordings(records, path)
    assert sorted(session.speech_ends) == [1, 2]
    out = tmp_path / "replay.jsonl"
    result = asyncio.run(replay_local(session, FakePipeline(), out, speed=1.0))
    assert result.transcript == "hello there hello there"
    assert result.reply == "Hi, nice to meet you. Hi, nice to meet you."
    replayed = read_records(out)
    assert sorted(firsts(replayed, "out.first_audio")) == [1, 2]
    assert {r["session"] for r in replayed} != {session.session}  # a new session


def test_a_recorded_server_session_replays_through_ws_and_twilio(tmp_path: Path) -> None:
    traces = tmp_path / "traces"

    async def scenario() -> None:
        app, _ = fake_app(FakePipeline(), trace_dir=traces, record_audio=True, max_sessions=8)
        async with running(app) as host:
            async with client(host) as c:  # the recorded session, as a browser would speak
                await c.send_json(
                    {"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}}
                )
                await c.event("session.started")
                await c.stream(np.concatenate([TWO_TURNS, silence(0.5)]), 16000)
                await c.wait(lambda: c.types().count("turn.metrics") == 2, timeout_s=20)
                await c.send_json({"type": "session.end"})
                await c.closed_with()
            (recorded,) = traces.glob("*.jsonl")
            served = summarize(read_trace(recorded), label="server")  # the server's own trace analyses too
            assert served.voice_to_voice.n == 2 and not served.problems, served.text_table()
            (session,) = recordings(read_records(recorded), recorded)
            over_ws = await replay_ws(session, f"ws://{host}/ws", tmp_path / "ws.jsonl", speed=1.0)
            assert over_ws.transcript == "hello there hello there", over_ws
            assert over_ws.reply == "Hi, nice to meet you. Hi, nice to meet you.", over_ws
            await replay_twilio(session, f"ws://{host}/twilio", tmp_path / "phone.jsonl", speed=1.0)

    asyncio.run(scenario())
    ws = read_records(tmp_path / "ws.jsonl")
    ends, outs = firsts(ws, "vad.speech_end"), firsts(ws, "out.first_audio")
    assert sorted(ends) == sorted(outs) == [1, 2]
    for turn in (
        1,
        2,
    ):  # voice-to-voice from the end of speech: the fake speaks at once after 10 quiet frames
        assert 150 <= (outs[turn] - ends[turn]) / 1e6 <= 1500, (turn, ends, outs)
    assert {r["event"] for r in ws} >= {
        "asr.final",
        "llm.first_block",
        "llm.block",
        "tts.first_audio",
        "turn.end",
    }
    phone = read_records(tmp_path / "phone.jsonl")
    ends, outs = firsts(phone, "vad.speech_end"), firsts(phone, "out.first_audio")
    assert sorted(ends) == sorted(outs) == [1, 2]
    assert all(0 < (outs[t] - ends[t]) / 1e6 <= 1500 for t in (1, 2)), (ends, outs)
