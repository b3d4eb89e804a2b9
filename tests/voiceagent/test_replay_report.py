"""The replay tool's analysis and reports (voiceagent/replay/) on traces written by hand with known timings.

Every expected number below is worked out by hand from the offsets the helper writes; percentiles are numpy's
linear interpolation (p95 of [100, 200, 300, 400, 1000] is 400 + 0.8 * 600 = 880).
"""

from __future__ import annotations

import html
import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from voiceagent.replay.analysis import STAGES, RunSummary, summarize
from voiceagent.replay.chrome import chrome_trace
from voiceagent.replay.compare import compare, is_regression
from voiceagent.replay.report import write_html, write_png
from voiceagent.replay.stats import Speculative, percentiles
from voiceagent.replay.traces import read_trace

T0 = 1_000_000_000_000  # ns: the first session starts here
TURN_GAP_NS = 10_000_000_000  # 10 s between the turns' speech ends
MS = 1_000_000


@dataclass
class Turn:
    """One turn's offsets in ms from its speech end (None: the event is not written)."""

    v2v: float | None = 400.0
    speech_ms: float = 1500.0  # speech_start is this long before speech_end
    endpointing: float | None = 60.0
    asr_final: float | None = 120.0
    first_block: float | None = 250.0
    tts: float | None = 320.0
    blocks: list[tuple[float, int | None, int | None, int | None]] = field(default_factory=list)
    played: list[float] = field(default_factory=list)
    outcome: str = "done"  # done | interrupted | error | incomplete
    text: str = "what is the time"
    reply: str = "It is noon."
    preemptive: bool = False
    typed: bool = False


def trace_records(turns: list[Turn], session: str = "s1", start_ns: int = T0) -> list[dict[str, Any]]:
    """The records of one session with `turns`, VAD edges first (as the session writes them, with their
    earlier frame times), then the rest."""
    records: list[dict[str, Any]] = []

    def add(event: str, turn: int, t_ns: int, **data: Any) -> None:
        stage = event.split(".", 1)[0]
        records.append(
            {"t_ns": t_ns, "session": session, "turn": turn, "stage": stage, "event": event, **data}
        )

    add("session.start", 0, start_ns, transport="ws", output_rate=16000)
    for number, turn in enumerate(turns, start=1):
        end_ns = start_ns + number * TURN_GAP_NS

        def at(ms: float, end_ns: int = end_ns) -> int:
            return end_ns + round(ms * MS)

        if turn.typed:
            add("asr.final", number, at(turn.asr_final or 0.0), text=turn.text, typed=True)
        else:
            add("vad.speech_start", number, at(-turn.speech_ms), confirmed_ns=at(-turn.speech_ms + 200))
            if turn.endpointing is not None:
                add("vad.speech_end", number, end_ns, confirmed_ns=at(turn.endpointing))
            add("asr.partial", number, at(-500), stable="what is", text="what is the", pause=False)
            if turn.asr_final is not None:
                add("asr.final", number, at(turn.asr_final), text=turn.text)
        if turn.first_block is not None:
            add("llm.first_block", number, at(turn.first_block), n_drafted=4, n_accepted=3,
                preemptive=turn.preemptive)  # fmt: skip
        for t, tokens, drafted, accepted in turn.blocks:
            add(
                "llm.block",
                number,
                at(t),
                text="word ",
                n_tokens=tokens,
                n_drafted=drafted,
                n_accepted=accepted,
            )
        if turn.tts is not None:
            add("tts.first_audio", number, at(turn.tts), phrase="It is noon.")
        if turn.v2v is not None:
            add("out.first_audio", number, at(turn.v2v))
        for t in turn.played:
            add("out.played", number, at(t), samples=1600, ms=100.0)
        if turn.outcome == "done":
            add("turn.end", number, at(3000), reason="done", reply=turn.reply)
        elif turn.outcome == "interrupted":
            add("turn.interrupted", number, at(3000), spoken_text="It is")
        elif turn.outcome == "error":
            add("turn.error", number, at(3000), stage="llm", message="RuntimeError: boom")
    add("session.end", len(turns), start_ns + (len(turns) + 1) * TURN_GAP_NS)
    return records


def write_jsonl(path: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records) + tail)
    return path


V2V = [100.0, 200.0, 300.0, 400.0, 1000.0]


def five_turns() -> list[Turn]:
    return [Turn(v2v=v, tts=v - 10, first_block=v - 20, asr_final=v - 30) for v in V2V]


# ----- percentiles -------------------------------------------------------------------------------


def test_percentiles_are_linear_interpolation() -> None:
    stats = percentiles(V2V)
    assert (stats.n, stats.p50, stats.p95, stats.max, stats.mean) == (5, 300.0, 880.0, 1000.0, 400.0)
    two = percentiles([10.0, 20.0])
    assert (two.p50, two.p95) == (15.0, 19.5)
    one = percentiles([7.0])
    assert (one.n, one.p50, one.p95, one.max, one.mean) == (1, 7.0, 7.0, 7.0, 7.0)
    empty = percentiles([])
    assert (empty.n, empty.p50, empty.p95, empty.max, empty.mean) == (0, None, None, None, None)


# ----- reading and analysing a clean trace -------------------------------------------------------


def test_stages_and_percentiles_of_a_hand_made_trace(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", trace_records(five_turns()))
    trace = read_trace(path)
    assert trace.problems == []
    summary = summarize(trace, "run")
    assert summary.problems == []
    assert [t.turn for t in summary.turns] == [1, 2, 3, 4, 5]
    assert summary.turns[0].stages == {
        "endpointing": 60.0,
        "asr_final": 70.0,
        "first_block": 80.0,
        "tts_first_audio": 90.0,
        "voice_to_voice": 100.0,
    }
    assert summary.turns[4].stages["asr_final"] == 970.0
    v2v = summary.voice_to_voice
    assert (v2v.n, v2v.p50, v2v.p95, v2v.max, v2v.mean) == (5, 300.0, 880.0, 1000.0, 400.0)
    # first_block = v2v - 20: [80, 180, 280, 380, 980] -> p95 380 + 0.8 * 600
    fb = summary.stages["first_block"]
    assert (fb.p50, fb.p95, fb.max, fb.mean) == (280.0, 860.0, 980.0, 380.0)
    assert summary.stages["endpointing"].p50 == 60.0
    assert [t.outcome for t in summary.turns] == ["done"] * 5
    assert summary.turns[2].transcript == "what is the time"
    assert summary.turns[2].reply == "It is noon."
    data = summary.to_json()
    json.dumps(data)  # plain JSON
    assert data["label"] == "run" and data["turns"] == 5
    assert data["voice_to_voice"] == {"n": 5, "p50": 300.0, "p95": 880.0, "max": 1000.0, "mean": 400.0}
    assert data["stages"]["voice_to_voice"] == data["voice_to_voice"]
    assert list(data["stages"]) == list(STAGES)
    assert data["problems"] == []
    assert data["outcomes"] == {"done": 5, "interrupted": 0, "error": 0, "incomplete": 0}
    assert "voice-to-voice" in summary.text_table() and "880.0" in summary.text_table()


def test_speculative_figures(tmp_path: Path) -> None:
    turns = [
        # 3 blocks of 4, 2 and 3 tokens at 250, 300, 350 ms: 100 ms over the 5 tokens after the first block
        Turn(blocks=[(250, 4, 4, 3), (300, 2, 4, 1), (350, 3, 4, 2)], preemptive=True),
        # a null count: tokens from the others, no ms/token (every block's count is needed)
        Turn(blocks=[(250, 1, None, None), (290, None, 2, 2)]),
        # one block: no decoding time
        Turn(blocks=[(250, 6, 8, 5)]),
    ]
    summary = summarize(read_trace(write_jsonl(tmp_path / "t.jsonl", trace_records(turns))), "run")
    first, second, third = (t.speculative for t in summary.turns)
    assert (first.blocks, first.tokens, first.drafted, first.accepted) == (3, 9, 12, 6)
    assert first.acceptance_rate == 0.5 and first.tokens_per_block == 3.0
    assert first.ms_per_token == pytest.approx(20.0)
    assert first.preemptive_turns == 1
    assert (second.blocks, second.tokens, second.drafted, second.accepted) == (2, 1, 2, 2)
    assert second.tokens_per_block == 1.0 and second.ms_per_token is None
    assert third.ms_per_token is None and third.acceptance_rate == 5 / 8
    run = summary.speculative
    assert (run.blocks, run.tokens, run.drafted, run.accepted, run.preemptive_turns) == (6, 16, 22, 13, 1)
    assert run.acceptance_rate == 13 / 22
    assert run.tokens_per_block == 16 / 5  # the block with no count is left out
    assert run.ms_per_token == pytest.approx(20.0)
    assert summary.to_json()["speculative"]["acceptance_rate"] == round(13 / 22, 4)
    assert Speculative().acceptance_rate is None and Speculative().ms_per_token is None


def test_outcomes_typed_turns_and_spans(tmp_path: Path) -> None:
    turns = [
        Turn(blocks=[(250, 2, 2, 2), (400, 2, 2, 2)], played=[500, 900]),
        Turn(outcome="interrupted"),
        Turn(outcome="error", v2v=None, tts=None),
        Turn(outcome="incomplete", endpointing=None, asr_final=None, first_block=None, tts=None, v2v=None),
        Turn(typed=True, asr_final=0.0, first_block=80.0, tts=150.0, v2v=200.0, text="typed <b>hi</b>"),
    ]
    summary = summarize(read_trace(write_jsonl(tmp_path / "t.jsonl", trace_records(turns))), "run")
    assert [t.outcome for t in summary.turns] == ["done", "interrupted", "error", "incomplete", "done"]
    assert summary.turns[2].error == "llm: RuntimeError: boom"
    assert summary.turns[3].stages == dict.fromkeys(STAGES)  # speech started, never ended
    typed = summary.turns[4]
    assert typed.typed and typed.stages == dict.fromkeys(STAGES)  # not counted in the voice stages
    assert typed.spans[0] == ("LLM first block", 0.0, 80.0)  # drawn from the asr.final time
    assert summary.voice_to_voice.n == 2  # the done and the interrupted turns: the others have none
    assert summary.stages["asr_final"].n == 3  # the error came later
    first = summary.turns[0]
    assert [tuple(s) for s in first.spans] == [
        ("user speech", -1500.0, 0.0),
        ("endpointing", 0.0, 60.0),
        ("ASR final", 60.0, 120.0),
        ("LLM first block", 120.0, 250.0),
        ("LLM decoding", 250.0, 400.0),
        ("TTS", 250.0, 320.0),
        ("audio out", 400.0, 900.0),
    ]
    assert [(m.label, m.t_ms) for m in first.markers] == [("block 1", 250.0), ("block 2", 400.0)]
    assert summary.problems == []


def test_the_wait_for_the_first_phrase_is_its_own_bar(tmp_path: Path) -> None:
    records = trace_records([Turn(first_block=250.0, tts=600.0, v2v=610.0)])
    end_ns = next(r["t_ns"] for r in records if r["event"] == "vad.speech_end")
    records.append({"t_ns": end_ns + 520 * MS, "session": "s1", "turn": 1, "stage": "chunk",
                    "event": "chunk.phrase", "words": 4})  # fmt: skip
    (turn,) = summarize(read_trace(write_jsonl(tmp_path / "t.jsonl", records)), "run").turns
    spans = {s.label: (s.start_ms, s.end_ms) for s in turn.spans}
    assert spans["first phrase"] == (250.0, 520.0) and spans["TTS"] == (520.0, 600.0)


def test_several_sessions_in_one_file_are_kept_apart(tmp_path: Path) -> None:
    a = trace_records([Turn(v2v=100.0), Turn(v2v=300.0)], session="a")
    b = trace_records([Turn(v2v=200.0)], session="b", start_ns=T0 + 100 * TURN_GAP_NS)
    summary = summarize(read_trace(write_jsonl(tmp_path / "t.jsonl", b + a)), "run")
    assert [(t.session, t.turn) for t in summary.turns] == [("a", 1), ("a", 2), ("b", 1)]
    assert [t.voice_to_voice for t in summary.turns] == [100.0, 300.0, 200.0]
    assert summary.voice_to_voice.p50 == 200.0


def test_file_order_is_not_time_order(tmp_path: Path) -> None:
    records = trace_records(five_turns())
    records.reverse()
    summary = summarize(read_trace(write_jsonl(tmp_path / "t.jsonl", records)), "run")
    assert summary.problems == []
    assert [t.voice_to_voice for t in summary.turns] == V2V


# ----- bad traces --------------------------------------------------------------------------------


def test_a_truncated_last_line_is_reported_and_the_rest_analysed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", trace_records(five_turns()), tail='{"t_ns": 12, "sess')
    lines = path.read_text().count("\n") + 1
    trace = read_trace(path)
    assert trace.problems == [
        f"line {lines}: the last line is cut short (the writer stopped mid-line?); skipped"
    ]
    summary = summarize(trace, "run")
    assert summary.voice_to_voice.p95 == 880.0
    assert summary.problems == trace.problems


def test_corrupt_lines_in_the_middle_are_reported_with_their_line_numbers(tmp_path: Path) -> None:
    good = [json.dumps(r) for r in trace_records(five_turns())]
    bad = [
        "this is not json",
        "[1, 2, 3]",
        '{"session": "s1", "turn": 1, "event": "out.played"}',
        '{"t_ns": "12", "session": "s1", "turn": 1, "event": "out.played"}',
        '{"t_ns": 12, "session": "s1", "turn": 1.5, "event": "out.played"}',
        '{"t_ns": 12, "session": "s1", "turn": 1, "event": 7}',
        '{"t_ns": true, "session": "s1", "turn": 1, "event": "out.played"}',
        '{"t_ns": 12, "session": 3, "turn": 1, "event": "out.played"}',
    ]
    lines = good[:3] + bad + [""] + good[3:]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    trace = read_trace(path)
    assert [p.split(":")[0] for p in trace.problems] == [f"line {n}" for n in range(4, 12)]
    assert "not JSON" in trace.problems[0] and "not a JSON object but list" in trace.problems[1]
    assert "no 't_ns'" in trace.problems[2] and "'t_ns' is not an integer" in trace.problems[3]
    assert "'turn' is not an integer" in trace.problems[4] and "'event' is not a string" in trace.problems[5]
    assert (
        "'t_ns' is not an integer" in trace.problems[6] and "'session' is not a string" in trace.problems[7]
    )
    assert all(p.endswith("skipped") for p in trace.problems)
    assert len(trace.records) == len(good)
    assert summarize(trace, "run").voice_to_voice.p95 == 880.0


def test_unknown_events_are_kept_noted_once_and_not_analysed(tmp_path: Path) -> None:
    records = trace_records(five_turns())
    strange = {"t_ns": T0 + 1, "session": "s1", "turn": 1, "stage": "x", "event": "x.strange"}
    # an unknown event that would open a turn of its own if it were analysed
    records += [strange, {**strange, "turn": 99}, {**strange, "event": "out.first_audio_v2", "turn": 2}]
    records.append({"t_ns": T0 + 2, "session": "s1", "turn": 0, "stage": "twilio", "event": "twilio.start"})
    trace = read_trace(write_jsonl(tmp_path / "t.jsonl", records))
    assert len(trace.records) == len(records)
    assert len(trace.problems) == 2
    assert "unknown event 'x.strange' (2 records)" in trace.problems[0]
    assert "unknown event 'out.first_audio_v2' (1 record)" in trace.problems[1]
    summary = summarize(trace, "run")
    assert [t.turn for t in summary.turns] == [1, 2, 3, 4, 5]
    assert summary.voice_to_voice.p50 == 300.0


def test_out_of_order_timestamps_are_reported_and_not_counted(tmp_path: Path) -> None:
    records = trace_records(five_turns())
    # turn 5's first audio dated 50 ms before its speech end; turn 4's before the session started
    for record in records:
        if record["turn"] == 5 and record["event"] == "out.first_audio":
            record["t_ns"] = T0 + 5 * TURN_GAP_NS - 50 * MS
        if record["turn"] == 4 and record["event"] == "tts.first_audio":
            record["t_ns"] = T0 - 1
    # turn 1's speech started before the session: audio is dated back from its message's arrival, so the
    # first frames of a session may be (gateway/inbound.py); a VAD edge more than a second early is not
    for record in records:
        if record["turn"] == 1 and record["event"] == "vad.speech_start":
            record["t_ns"] = T0 - 20 * MS
        if record["turn"] == 2 and record["event"] == "vad.speech_start":
            record["t_ns"] = T0 - 1001 * MS
    summary = summarize(read_trace(write_jsonl(tmp_path / "t.jsonl", records)), "run")
    assert summary.turns[0].spans[0].label == "user speech"
    assert summary.turns[1].spans[0].label == "endpointing"
    assert summary.turns[4].voice_to_voice is None
    assert summary.turns[3].stages["tts_first_audio"] is None
    v2v = summary.voice_to_voice
    assert (v2v.n, v2v.p50, v2v.max) == (4, 250.0, 400.0)
    assert len(summary.problems) == 2
    early, negative = summary.problems
    assert "2 record(s) dated before its session.start" in early and "turn 2 vad.speech_start" in early
    assert "session s1 turn 5: voice-to-voice is 50.0 ms before the end of speech" in negative
    assert "not counted" in negative


def test_an_empty_file_and_a_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    trace = read_trace(empty)
    assert trace.records == [] and trace.problems == ["empty.jsonl: the file is empty (no records)"]
    summary = summarize(trace, "empty")
    assert summary.turns == [] and summary.voice_to_voice.n == 0
    assert summary.to_json()["voice_to_voice"]["p50"] is None
    assert "0 turn(s)" in summary.text_table()
    with pytest.raises(FileNotFoundError, match=re.escape(f"no trace file at {tmp_path / 'nope.jsonl'}")):
        read_trace(tmp_path / "nope.jsonl")


def test_a_real_session_trace_format(tmp_path: Path) -> None:
    """The writer's own records (voiceagent/trace.py) read back as the analysis expects."""
    from voiceagent.clock import MonotonicClock
    from voiceagent.trace import Trace

    clock = MonotonicClock()
    path = tmp_path / "real.jsonl"
    trace = Trace(path, "abc", clock)
    trace.write("session.start", 0, transport="ws", output_rate=16000)
    base = clock.now_ns()
    trace.write("vad.speech_start", 1, t_ns=base + 100 * MS, confirmed_ns=base + 300 * MS)
    trace.write("vad.speech_end", 1, t_ns=base + 1000 * MS, confirmed_ns=base + 1200 * MS)
    trace.write("asr.final", 1, t_ns=base + 1300 * MS, text="hello")
    trace.write("llm.first_block", 1, t_ns=base + 1400 * MS, n_drafted=3, n_accepted=2, preemptive=False)
    trace.write("llm.block", 1, t_ns=base + 1400 * MS, text="Hi", n_tokens=3, n_drafted=3, n_accepted=2)
    trace.write("tts.first_audio", 1, t_ns=base + 1500 * MS, phrase="Hi")
    trace.write("out.first_audio", 1, t_ns=base + 1550 * MS)
    trace.write("turn.end", 1, t_ns=base + 1600 * MS, reason="done", reply="Hi")
    trace.close()
    summary = summarize(read_trace(path), "real")
    assert summary.problems == []
    assert summary.turns[0].stages == {
        "endpointing": 200.0,
        "asr_final": 300.0,
        "first_block": 400.0,
        "tts_first_audio": 500.0,
        "voice_to_voice": 550.0,
    }


# ----- comparing runs ----------------------------------------------------------------------------


def _run(tmp_path: Path, name: str, v2v: list[float], **turn: Any) -> RunSummary:
    records = trace_records([Turn(v2v=v, **turn) for v in v2v])
    return summarize(read_trace(write_jsonl(tmp_path / f"{name}.jsonl", records)), name)


@pytest.mark.parametrize(
    ("base", "new", "regressed"),
    [
        ([300.0], [351.0], True),  # +51 ms, +17%
        ([300.0], [350.0], False),  # +50 ms: not more than 50
        ([1000.0], [1100.0], False),  # +100 ms but only +10%
        ([1000.0], [1101.0], True),  # +101 ms, +10.1%
        ([300.0], [200.0], False),  # faster
        ([100.0, 200.0, 300.0], [100.0, 400.0, 500.0], True),  # p50 200 -> 400
    ],
)
def test_a_stage_regresses_when_its_p50_grows_beyond_both_thresholds(
    tmp_path: Path, base: list[float], new: list[float], regressed: bool
) -> None:
    comparison = compare(_run(tmp_path, "base", base), _run(tmp_path, "new", new))
    assert comparison.regressed == (["voice_to_voice"] if regressed else [])
    delta = comparison.stage("voice_to_voice")
    assert delta.p50_delta == statistics.median(new) - statistics.median(base)
    assert delta.regressed is regressed
    data = comparison.to_json()
    json.dumps(data)
    assert data["regressed"] == comparison.regressed
    assert data["stages"]["voice_to_voice"]["p50_delta_ms"] == delta.p50_delta
    table = comparison.text_table()
    assert ("REGRESSED: voice-to-voice" in table) is regressed
    assert ("no stage regressed" in table) is not regressed


def test_comparison_thresholds_and_missing_stages(tmp_path: Path) -> None:
    base = _run(tmp_path, "base", [100.0, 100.0], tts=None)
    new = _run(tmp_path, "new", [130.0, 130.0], tts=500.0)
    assert compare(base, new).regressed == []  # +30 ms
    tight = compare(base, new, threshold_ms=20.0, threshold_pct=25.0)
    assert tight.regressed == ["voice_to_voice"]  # +30 ms and +30%
    assert tight.threshold_ms == 20.0 and tight.stage("voice_to_voice").p50_delta_pct == pytest.approx(30.0)
    assert compare(base, new, threshold_ms=20.0, threshold_pct=30.0).regressed == []  # 30% is not more
    tts = tight.stage("tts_first_audio")  # only the new run has it: shown, never a regression
    assert (tts.base_p50, tts.new_p50, tts.p50_delta, tts.regressed) == (None, 500.0, None, False)
    assert is_regression(0.0, 60.0, 50.0, 10.0) and not is_regression(0.0, 50.0, 50.0, 10.0)
    assert not is_regression(None, 900.0, 50.0, 10.0)


# ----- the Chrome trace --------------------------------------------------------------------------


def test_the_chrome_trace_is_well_formed_and_timed(tmp_path: Path) -> None:
    turns = [
        Turn(blocks=[(250.0, 2, 2, 2), (400.0, 3, 4, 3)], played=[600.0, 900.0]),
        Turn(),
        Turn(typed=True),
    ]
    one = summarize(read_trace(write_jsonl(tmp_path / "a.jsonl", trace_records(turns, session="a"))), "one")
    two = _run(tmp_path, "two", [100.0, 200.0])
    trace = chrome_trace([one, two])
    assert json.loads(json.dumps(trace)) == trace
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    for event in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= event.keys(), event
        assert event["ph"] in ("X", "i", "M"), event
        if event["ph"] == "X":
            assert event["dur"] >= 0, event
    named = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert named == {1: "one | session a", 2: "two | session s1"}
    lanes = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in events if e["ph"] != "M"} <= lanes  # every lane has a name
    timed = [e for e in events if e["ph"] != "M" and e["pid"] == 1]
    assert min(e["ts"] for e in timed) == 0  # the run's first moment: turn 1's speech start
    spans = {(e["name"], e["args"]["turn"]): e for e in timed if e["ph"] == "X" and e["cat"] == "stage"}
    assert spans[("user speech", 1)]["dur"] == 1_500_000
    assert spans[("endpointing", 1)]["ts"] == 1_500_000 and spans[("endpointing", 1)]["dur"] == 60_000
    assert spans[("endpointing", 2)]["ts"] - spans[("endpointing", 1)]["ts"] == TURN_GAP_NS / 1000
    assert spans[("audio out", 1)]["dur"] == 500_000  # first audio at 400 ms, played to 900 ms
    blocks = [e for e in timed if e["ph"] == "i" and e["cat"] == "llm"]
    assert [(b["ts"], b["args"]["n_tokens"]) for b in blocks] == [(1_750_000, 2), (1_900_000, 3)]
    v2v = [e for e in timed if e["name"] == "voice-to-voice"]
    assert [e["args"]["voice_to_voice_ms"] for e in v2v] == [400.0, 400.0]  # the typed turn has none
    assert ("LLM first block", 3) in spans  # the typed turn is drawn from its message
    assert chrome_trace([]) == {"traceEvents": [], "displayTimeUnit": "ms"}


# ----- the HTML report and the PNG ---------------------------------------------------------------

HOSTILE = "<script>alert('x')</script> & costs $5"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, RunSummary, RunSummary]:
    """A report of two runs (the second slower at voice-to-voice) with a comparison."""
    directory = tmp_path_factory.mktemp("report")
    turns = [Turn(v2v=400.0, text=HOSTILE, reply="<b>bold</b>", blocks=[(250.0, 2, 2, 2)], played=[700.0])]
    turns += [Turn(v2v=500.0, typed=True), Turn(outcome="incomplete", endpointing=None, v2v=None)]
    records = trace_records(turns)
    records.append({**records[3], "event": "odd.<event>"})
    base = summarize(read_trace(write_jsonl(directory / "base.jsonl", records)), "base <run>")
    new = _run(directory, "new", [900.0, 950.0])
    path = directory / "report.html"
    write_html(path, [base, new], compare(base, new))
    return path.read_text(encoding="utf-8"), base, new


def test_the_html_report_is_self_contained(report: tuple[str, RunSummary, RunSummary]) -> None:
    page, _, _ = report
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert "<style>" in page
    # one waterfall per turn position that has something to draw: turn 1 (both runs), turn 2 (typed and
    # the new run's second turn); the base run's third turn (no end of speech) has nothing to draw
    assert page.count("<svg") == 2 and page.count("</svg>") == 2
    assert "<?xml" not in page and "<metadata>" not in page
    assert page.count("(nothing to draw)") == 1  # position 3: only the base run's turn, unended
    assert 'class="waterfall"' in page and "viewBox=" in page


def test_the_html_report_escapes_the_trace_text(report: tuple[str, RunSummary, RunSummary]) -> None:
    page, base, _ = report
    assert "<script>" not in page and "<b>bold</b>" not in page
    assert html.escape(HOSTILE) in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "base &lt;run&gt;" in page and "base <run>" not in page
    assert any("odd.<event>" in problem for problem in base.problems)
    assert "odd.&lt;event&gt;" in page and "odd.<event>" not in page


def test_the_html_report_shows_the_tables(report: tuple[str, RunSummary, RunSummary]) -> None:
    page, _, _ = report
    assert page.count('<tr class="regressed">') == 1  # voice-to-voice: 400 -> 925
    assert "voice-to-voice (regressed)" in page and "Regressed: voice-to-voice" in page
    assert "+525.0" in page and "+131.2%" in page
    assert page.count('<table class="turns">') == 2 and page.count('<table class="stages">') == 2
    assert "done (typed)" in page and "incomplete" in page
    assert "100.0%" in page  # the base run accepted 2 of 2 drafted


def test_the_png_waterfall(tmp_path: Path) -> None:
    run = _run(tmp_path, "run", [100.0 * k for k in range(1, 9)], blocks=[(250.0, 2, 2, 2)], played=[900.0])

    def size(path: Path) -> tuple[int, int]:
        header = path.read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")

    write_png(tmp_path / "all.png", run)
    write_png(tmp_path / "six.png", _run(tmp_path, "six", [100.0 * k for k in range(1, 7)], played=[900.0]))
    write_png(tmp_path / "one.png", run, turn=2)
    width, height = size(tmp_path / "all.png")
    assert width == 1200 and 900 < height < 2400
    assert size(tmp_path / "six.png")[1] == height  # 8 turns: the first 6 are drawn
    assert size(tmp_path / "one.png")[0] == 1200 and size(tmp_path / "one.png")[1] < height / 3


def test_drawing_leaves_pyplot_alone(tmp_path: Path) -> None:
    """The report draws on Figure objects: pyplot (and a GUI backend) is never loaded."""
    code = (
        "import sys; from pathlib import Path; from voiceagent.replay.report import write_png;"
        "from voiceagent.replay.analysis import RunSummary, summarize;"
        "from voiceagent.replay.traces import read_trace;"
        f"write_png({str(tmp_path / 'x.png')!r}, summarize(read_trace({str(tmp_path / 'x.jsonl')!r}), 'x'));"
        "print('matplotlib.pyplot' in sys.modules)"
    )
    write_jsonl(tmp_path / "x.jsonl", trace_records([Turn()]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert (tmp_path / "x.png").stat().st_size > 1000
