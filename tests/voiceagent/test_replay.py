"""`voiceagent replay` end to end on the real bundled models (SmolLM2-135M pair, greedy; Whisper tiny.en;
Piper): a `voiceagent talk` session recorded with its audio replays in-process and against a live gateway's
/ws, hearing the same words and saying the same reply (see `assert_same_words`), and reports both runs
(HTML, PNG, Chrome trace, JSON)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fakes import espeak_speech, silence
from tests.gateway.helpers import running
from voiceagent.audio import write_wav
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app
from voiceagent.pipeline import Pipeline
from voiceagent.wer import normalized_words, word_error_rate

pytestmark = pytest.mark.bundled

REPO = Path(__file__).resolve().parents[2]
SMOL = "smollm2-135m-instruct"
QUESTION = "How many legs does a spider have?"  # tiny.en hears it the same wherever its partials cut it
MODELS = ["--target", SMOL, "--draft", SMOL]
ENV = {
    **os.environ,
    "VOICEAGENT_DRAFT_QUANT": "none",
    "VOICEAGENT_TTS": "piper",
    "VOICEAGENT_ASR_MODEL": "tiny.en",
}


def voiceagent(*args: str) -> list[str]:
    return [sys.executable, "-m", "voiceagent", *args]


def last_json(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def assert_same_words(replayed: dict[str, Any], talked: dict[str, Any], log: str) -> None:
    """The replay heard the recorded words and, greedy, said the recorded reply to them.

    Streaming Whisper is not a pure function of the audio: its partial passes run when the CPU lets them,
    and the words they agree on shape the final transcript, so a replay may hear a word differently (one
    CI run heard "legs done a spider" for "legs does a spider"). The transcript may differ by one word in
    seven; when it is the same, the greedy reply must be the same too. The recording is a run like any
    other: where it misheard (one loaded CI run's final pass heard "does a aspire to have"), a replay that
    heard the question its audio holds (to within a word in seven) heard the recorded words.
    """
    words_off = min(
        word_error_rate(truth, replayed["transcript"]) for truth in (talked["transcript"], QUESTION)
    )
    assert words_off <= 0.15, log
    assert replayed["reply"].strip(), log
    if normalized_words(replayed["transcript"]) == normalized_words(talked["transcript"]):
        assert replayed["reply"] == talked["reply"], log


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """`voiceagent talk --record-audio` on a spoken question, in real time: its trace and its result."""
    folder = tmp_path_factory.mktemp("recorded")
    question = np.concatenate([silence(0.5), espeak_speech(QUESTION, folder), silence(0.5)])
    write_wav(folder / "question.wav", question, 16000)
    trace = folder / "talk.jsonl"
    run = subprocess.run(
        voiceagent("talk", str(folder / "question.wav"), "--trace", str(trace), "--record-audio", *MODELS),
        capture_output=True, text=True, cwd=REPO, timeout=600, env=ENV,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = last_json(run.stdout)
    assert result["transcript"].strip() and result["reply"].strip(), result
    assert list((folder / "talk.audio").glob("turn-*.wav")), "no audio recorded"
    return trace, result


def test_a_recorded_talk_replays_in_process_with_the_same_words(
    recorded: tuple[Path, dict[str, Any]],
) -> None:
    trace, talked = recorded
    report, out = trace.with_name("local.html"), trace.with_name("local.replay.jsonl")
    flags = ["--out", str(out), "--report", str(report), "--json"]
    run = subprocess.run(
        voiceagent("replay", str(trace), "--against", "local", *MODELS, *flags),
        capture_output=True, text=True, cwd=REPO, timeout=600, env=ENV,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    numbers = last_json(run.stdout)
    (replayed,) = numbers["replayed"]
    assert_same_words(replayed, talked, run.stderr)
    recorded_run, replay_run = numbers["runs"]
    for summary in (recorded_run, replay_run):
        assert summary["voice_to_voice"]["n"] == 1 and summary["voice_to_voice"]["p50"] > 0, summary
    assert "<svg" in report.read_text()


def test_a_recorded_talk_replays_against_a_live_server(recorded: tuple[Path, dict[str, Any]]) -> None:
    trace, talked = recorded
    folder = trace.parent
    settings = Settings(target=SMOL, draft=SMOL, draft_quant="none", asr_model="tiny.en", tts="piper")
    pipeline = Pipeline.load(settings, log=lambda message: None)
    outputs = {
        "--report": folder / "ws.html",
        "--png": folder / "ws.png",
        "--chrome-trace": folder / "ws.trace.json",
    }

    async def scenario() -> tuple[int, bytes, bytes]:
        await pipeline.warm_up()
        async with running(build_app(pipeline, settings)) as host:
            flags = [str(part) for pair in outputs.items() for part in pair]
            command = voiceagent("replay", str(trace), "--against", f"ws://{host}/ws", "--json", *flags)
            process = await asyncio.create_subprocess_exec(
                *command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            stdout, stderr = await asyncio.wait_for(process.communicate(), 300)
            return process.returncode or 0, stdout, stderr

    code, stdout, stderr = asyncio.run(scenario())
    assert code == 0, stderr.decode()
    numbers = last_json(stdout.decode())
    (replayed,) = numbers["replayed"]
    assert_same_words(replayed, talked, stderr.decode())
    recorded_run, replay_run = numbers["runs"]
    assert replay_run["voice_to_voice"]["n"] == 1 and replay_run["voice_to_voice"]["p50"] > 0, replay_run
    assert numbers["comparison"] is not None
    assert outputs["--png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(outputs["--chrome-trace"].read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events)
    assert outputs["--report"].read_text().count("<svg") >= 1
