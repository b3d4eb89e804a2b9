"""`voiceagent replay` as a command on hand-made traces: the exit code gates on a regressed p50, the last
line is the JSON of the numbers, and a damaged trace is reported, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.voiceagent.test_replay_report import Turn, trace_records, write_jsonl
from voiceagent.cli import main


def replay(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["replay", *args, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), err


def run_of(tmp_path: Path, name: str, v2v: list[float]) -> Path:
    turns = [Turn(v2v=v, tts=v - 10, first_block=v - 20, asr_final=v - 30) for v in v2v]
    return write_jsonl(tmp_path / name, trace_records(turns))


def test_a_regressed_p50_exits_2_and_a_faster_run_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fast = run_of(tmp_path, "fast.jsonl", [300.0, 320.0, 340.0])
    slow = run_of(tmp_path, "slow.jsonl", [400.0, 420.0, 440.0])  # +100 ms, +31 %
    code, numbers, err = replay(capsys, str(slow), "--compare", str(fast))
    assert code == 2 and "voice_to_voice" in numbers["comparison"]["regressed"], err
    baseline, new = numbers["runs"]
    assert (baseline["voice_to_voice"]["p50"], new["voice_to_voice"]["p50"]) == (320.0, 420.0)
    code, numbers, _ = replay(capsys, str(fast), "--compare", str(slow))
    assert code == 0 and numbers["comparison"]["regressed"] == []
    code, _, _ = replay(capsys, str(slow), "--compare", str(fast), "--threshold-ms", "150")
    assert code == 0  # within the looser threshold


def test_a_damaged_trace_is_analysed_and_its_problems_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = trace_records([Turn(v2v=500.0), Turn(v2v=700.0)])
    lines = [json.dumps(r) for r in records]
    lines.insert(3, "{not json")
    path = tmp_path / "crashed.jsonl"
    path.write_text("\n".join(lines) + "\n" + json.dumps(records[-1])[:25])  # killed mid-write
    code, numbers, err = replay(capsys, str(path), "--chrome-trace", str(tmp_path / "c.json"))
    assert code == 0 and "Traceback" not in err
    (run,) = numbers["runs"]
    assert run["voice_to_voice"]["n"] == 2 and run["voice_to_voice"]["p50"] == 600.0
    assert len(run["problems"]) == 2 and "no recorded audio" in err
    assert json.loads((tmp_path / "c.json").read_text())["traceEvents"]


def test_bad_arguments_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = run_of(tmp_path, "t.jsonl", [300.0])
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["replay", str(trace), "--against", "http://127.0.0.1:1/ws"]) == 2
    assert main(["replay", str(trace), "--speed", "0"]) == 2
    err = capsys.readouterr().err
    assert "no trace file" in err and "--against must be" in err and "--speed must be > 0" in err
    assert "Traceback" not in err
