"""`voiceagent talk` end to end on the real bundled models, from speech synthesised in the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from voiceagent.audio import read_wav, write_wav
from voiceagent.wer import word_error_rate

pytestmark = pytest.mark.bundled

REPO = Path(__file__).resolve().parents[2]
SMOL = "smollm2-135m-instruct"


def spoken_question(tmp_path: Path, text: str) -> Path:
    """espeak-ng speech at 22.05 kHz stereo (any format must do), with silence around it."""
    raw = tmp_path / "raw.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True)
    speech = read_wav(raw, rate=22050)
    silence = np.zeros(22050, dtype=np.int16)
    padded = np.concatenate([silence, speech, silence // 2])
    path = tmp_path / "question.wav"
    write_wav(path, np.stack([padded, padded], axis=1), 22050)
    return path


def talk(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VOICEAGENT_DRAFT_QUANT": "none"}
    return subprocess.run(
        [sys.executable, "-m", "voiceagent", "talk", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env=env,
    )


def test_talk_hears_answers_and_speaks(tmp_path: Path) -> None:
    question = spoken_question(tmp_path, "What is the capital of France?")
    reply_wav, trace = tmp_path / "reply.wav", tmp_path / "trace.jsonl"
    run = talk(
        str(question),
        "--target",
        SMOL,
        "--draft",
        SMOL,
        "--fast",
        "--out",
        str(reply_wav),
        "--trace",
        str(trace),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert word_error_rate("what is the capital of france", result["transcript"]) <= 0.2, result["transcript"]
    assert result["reply"].strip()
    assert set(result["latency_ms"]) >= {"voice_to_voice", "asr_final", "first_block", "tts_first_audio"}
    assert all(v is not None and v > 0 for v in result["latency_ms"].values()), result["latency_ms"]
    # Whisper reads the agent's audio back as the reply it meant to say
    from voiceagent.asr import load_whisper

    model = load_whisper("tiny.en")
    segments, _ = model.transcribe(str(reply_wav), language="en", beam_size=1)
    heard = " ".join(segment.text for segment in segments)
    assert word_error_rate(result["reply"], heard) <= 0.25, (result["reply"], heard)
    events = [json.loads(line)["event"] for line in trace.read_text().splitlines()]
    for name in (
        "vad.speech_end",
        "asr.final",
        "llm.first_block",
        "llm.block",
        "tts.first_audio",
        "out.first_audio",
        "out.played",
    ):
        assert name in events, name


def test_talk_refuses_a_file_that_is_not_audio(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.wav"
    bogus.write_text("not audio at all")
    run = talk(str(bogus), "--target", SMOL, "--draft", "none", "--fast")
    assert run.returncode == 2 and "is not an audio file" in run.stderr and "Traceback" not in run.stderr


def test_a_recording_is_followed_by_silence_enough_for_the_longest_end_of_turn_wait() -> None:
    """A file ends where a microphone would go on: the silence after it must outlast the policy's longest
    wait (an incomplete-looking "Seven of clubs" waits 2 s), or the session never hears the end."""
    from voiceagent.session_options import SessionOptions
    from voiceagent.talk import TRAILING_SILENCE_S, trailing_silence_s
    from voiceagent.turn_taking import TurnTakingOptions

    assert trailing_silence_s(SessionOptions()) > SessionOptions().turn_taking.incomplete_silence_ms / 1000
    long_wait = SessionOptions(turn_taking=TurnTakingOptions(incomplete_silence_ms=4000))
    assert trailing_silence_s(long_wait) >= 4.5
    assert trailing_silence_s(SessionOptions(turn_taking=None)) == TRAILING_SILENCE_S
