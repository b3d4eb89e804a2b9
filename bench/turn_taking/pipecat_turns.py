"""Pipecat 1.14's default turn-taking on the bench's clips; run by the Pipecat virtualenv's Python.

    <pipecat venv>/bin/python bench/turn_taking/pipecat_turns.py CLIPS.json OUT.json

Imports only Pipecat and the standard library (this project is not installed in that virtualenv). Per
clip, 20 ms frames go through Pipecat's own `SileroVADAnalyzer` (its defaults: confidence 0.7, start 0.2 s,
stop 0.2 s, min volume 0.6) and `LocalSmartTurnAnalyzerV3` (the smart-turn-v3.2 ONNX in the wheel), wired
as `TurnAnalyzerUserTurnStopStrategy` wires them: every frame goes to the analyzer's `append_audio` with
the VAD's speaking state; when the VAD stops, Smart Turn runs on the turn's audio and a "complete" ends the
turn; otherwise its own 3 s silence timer does (Pipecat then also waits for a final transcript, which is
left out here: Pipecat's figures are a lower bound). Time is the audio's: the analyzer's clock
(`time.monotonic` in its module) is the clip's, and a Smart Turn inference ends the turn its measured
wall time after it started. Each user-turn start (the VAD's) is recorded, for interruptions.
"""

from __future__ import annotations

import json
import sys
import time
import wave

import numpy as np
from loguru import logger
from pipecat.audio.turn.base_turn_analyzer import EndOfTurnState
from pipecat.audio.turn.smart_turn import base_smart_turn
from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.audio.vad.vad_analyzer import VADState

RATE = 16000
FRAME = 320  # 20 ms


class AudioClock:
    """`time` for Pipecat's analyzer module: monotonic() is the clip's time, the rest is real."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def read_pcm16(path: str) -> np.ndarray:
    with wave.open(path, "rb") as wav:
        assert wav.getframerate() == RATE and wav.getnchannels() == 1 and wav.getsampwidth() == 2, path
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)


def run_clip(path: str, clock: AudioClock) -> dict[str, object]:
    vad = SileroVADAnalyzer(sample_rate=RATE)
    vad.set_sample_rate(RATE)  # what the pipeline does at its start
    turn = LocalSmartTurnAnalyzerV3()
    turn.set_sample_rate(RATE)
    audio = read_pcm16(path)
    starts, inferences, speaking, end_s, busy_until_s = [], [], False, None, 0.0
    previous = VADState.QUIET
    for i in range(0, len(audio) - FRAME + 1, FRAME):
        clock.now_s = t = i / RATE
        frame = audio[i : i + FRAME].tobytes()
        state = vad._run_analyzer(frame)
        if state == VADState.SPEAKING and previous != VADState.SPEAKING and not speaking:
            speaking = True
            starts.append(t)
            turn.update_vad_start_secs(vad.params.start_secs)
        stopped = speaking and state == VADState.QUIET
        previous = state
        if stopped:
            speaking = False
        if turn.append_audio(frame, speaking) == EndOfTurnState.COMPLETE and end_s is None:
            end_s = t  # the 3 s silence timer
        if stopped and end_s is None and t >= busy_until_s:
            started = time.perf_counter()
            verdict, _ = turn._process_speech_segment(turn._audio_buffer)
            took_s = time.perf_counter() - started
            inferences.append(took_s)
            busy_until_s = t + took_s
            if verdict == EndOfTurnState.COMPLETE:
                turn._clear(verdict)
                end_s = t + took_s
    return {"starts_s": starts, "end_s": end_s, "inference_s": inferences}


def main() -> int:
    clips_path, out_path = sys.argv[1:3]
    logger.remove()  # Pipecat logs every model load and VAD setting at DEBUG
    logger.add(sys.stderr, level="WARNING")
    clips = json.loads(open(clips_path).read())
    clock = AudioClock()
    base_smart_turn.time = clock  # type: ignore[assignment]
    results = {}
    for n, clip in enumerate(clips, start=1):
        results[clip["name"]] = run_clip(clip["path"], clock)
        print(f"pipecat: {n}/{len(clips)} {clip['name']}", file=sys.stderr, flush=True)
    with open(out_path, "w") as out:
        json.dump(results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
