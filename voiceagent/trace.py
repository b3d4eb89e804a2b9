"""The per-session latency trace: one JSON object per line, appended and flushed per event.

A record is `{"t_ns", "session", "turn", "stage", "event", ...data}` (see DESIGN.md). Flushing every line
means a crash loses nothing already written. Voice-to-voice latency = out.first_audio - vad.speech_end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from voiceagent.clock import Clock
from voiceagent.recording import AudioRecorder

# The headline stages, each measured from the end of the user's speech.
LATENCY_EVENTS = {
    "asr_final": "asr.final",
    "first_block": "llm.first_block",
    "tts_first_audio": "tts.first_audio",
    "voice_to_voice": "out.first_audio",
}


class Trace:
    """Writes trace records to `path` (if given) and keeps them in memory for the session's own figures.
    With `record_audio` (and a path) the user's input audio is kept too, in `S.audio/` beside `S.jsonl`."""

    def __init__(
        self, path: Path | str | None, session_id: str, clock: Clock, *, record_audio: bool = False
    ) -> None:
        self.session_id = session_id
        self.clock = clock
        self.records: list[dict[str, Any]] = []
        self._file: TextIO | None = None
        self._audio: AudioRecorder | None = None
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # closed in close()
            if record_audio:
                self._audio = AudioRecorder(path.with_suffix(".audio"), self.write)

    def record_audio(self, frame: np.ndarray, t_ns: int, turn: int) -> None:
        """Keeps one input frame when recording is on (see voiceagent/recording.py); else does nothing."""
        if self._audio is not None:
            self._audio.push(frame, t_ns, turn)

    def write(self, event: str, turn: int, t_ns: int | None = None, **data: Any) -> dict[str, Any]:
        record = {
            "t_ns": self.clock.now_ns() if t_ns is None else t_ns,
            "session": self.session_id,
            "turn": turn,
            "stage": event.split(".", 1)[0],
            "event": event,
            **data,
        }
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        return record

    def close(self) -> None:
        if self._audio is not None:
            self._audio.close()
            self._audio = None
        if self._file is not None:
            self._file.close()
            self._file = None


def turn_latencies_ms(records: list[dict[str, Any]], turn: int) -> dict[str, float | None]:
    """Milliseconds from the turn's vad.speech_end to the first record of each headline event."""
    first: dict[str, int] = {}
    for record in records:
        if record.get("turn") == turn and record["event"] not in first:
            first[record["event"]] = int(record["t_ns"])
    end = first.get("vad.speech_end")
    return {
        name: None if end is None or event not in first else (first[event] - end) / 1e6
        for name, event in LATENCY_EVENTS.items()
    }
