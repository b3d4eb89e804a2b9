"""Pipecat's side, seen from the bench: the worker (pipecat_voice.py) in Pipecat's own virtualenv, fed one
clip at a time over a pipe, its monotonic times turned into ms after the audio's speech end.

Stages: turn_end = UserStoppedSpeakingFrame (Smart Turn said complete, or its timer ran out, and the
transcript is in), transcript = the first TranscriptionFrame, first_text = the LLM service's first
LLMTextFrame, tts_first_audio = Piper's first TTSAudioRawFrame, voice_to_voice = the first audio frame the
output transport writes; vad_stop = the last VADUserStoppedSpeakingFrame before the turn ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.voice_vs_pipecat.timeline import SystemRun, after_speech_ms
from voiceagent.wer import word_error_rate

WORKER = Path(__file__).with_name("pipecat_voice.py")
Log = Callable[[str], None]


@dataclass(frozen=True)
class PipecatConfig:
    """What the worker builds its pipeline from (all local: paths and a loopback URL)."""

    whisper_dir: str
    voice_dir: str
    voice_name: str
    system_prompt: str
    max_tokens: int
    output_rate: int
    llm_url: str
    llm_model: str


def pipecat_run(result: dict[str, Any], question: str, end_s: float) -> SystemRun:
    """One worker result -> the clip's figures for Pipecat."""
    times: dict[str, int | None] = {name: result["times_ns"].get(name) for name in _STAGE_EVENTS}
    turn_end = times["turn_end"]
    stops = [t for t in result["vad_stops_ns"] if turn_end is None or t <= turn_end]
    times["vad_stop"] = stops[-1] if stops else None
    run = SystemRun(result["transcript"], result["reply"], errors=list(result["errors"]))
    run.word_error_rate = round(word_error_rate(question, run.transcript), 3)
    run.latency_ms = after_speech_ms(times, int(result["t0_ns"]), end_s)
    return run


_STAGE_EVENTS = ("turn_end", "transcript", "first_text", "tts_first_audio", "voice_to_voice")


class PipecatWorker:
    """The worker process: started with its models loaded, then one clip per `run`; `close` ends it."""

    def __init__(self, python: Path, config: PipecatConfig, scratch: Path, log: Log) -> None:
        config_path = scratch / "pipecat-config.json"
        config_path.write_text(json.dumps(config.__dict__))
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        # Pipecat's Whisper service leaves CTranslate2's thread count at its default (4); ours runs one
        # thread per core. OMP_NUM_THREADS gives CTranslate2 the same count here.
        env["OMP_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
        log("pipecat: starting its pipeline (Whisper, Silero, Smart Turn v3, OpenAI LLM, Piper)")
        self.process = subprocess.Popen(
            [str(python), str(WORKER), str(config_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, env=env,
        )  # fmt: skip
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"Pipecat's worker did not start: {ready}")

    def run(self, wav: Path) -> dict[str, Any]:
        """Plays the 16 kHz WAV at `wav` through Pipecat's pipeline; -> the worker's raw result (blocks)."""
        stdin: IO[str] = self._pipe(self.process.stdin)
        stdin.write(json.dumps({"path": str(wav)}) + "\n")
        stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _read(self) -> dict[str, Any]:
        line = self._pipe(self.process.stdout).readline()
        if not line:
            code = self.process.poll()
            raise RuntimeError(f"Pipecat's worker exited ({code}) without a result: see its output above")
        result: dict[str, Any] = json.loads(line)
        return result

    @staticmethod
    def _pipe(pipe: IO[str] | None) -> IO[str]:
        if pipe is None:
            raise RuntimeError("Pipecat's worker has no pipe")
        return pipe
