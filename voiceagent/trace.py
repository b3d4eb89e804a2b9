"""The per-session latency trace: one JSON object per line, appended and flushed per event.

A record is `{"t_ns", "session", "turn", "stage", "event", ...data}` (see DESIGN.md). Flushing every line
means a crash loses nothing already written. Voice-to-voice latency = out.first_audio - vad.speech_end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from voiceagent.clock import Clock

# The headline stages, each measured from the end of the user's speech.
LATENCY_EVENTS = {
    "asr_final": "asr.final",
    "first_block": "llm.first_block",
    "tts_first_audio": "tts.first_audio",
    "voice_to_voice": "out.first_audio",
}


class Trace:
    """Writes trace records to `path` (if given) and keeps them in memory for the session's own figures."""

    def __init__(self, path: Path | str | None, session_id: str, clock: Clock) -> None:
        self.session_id = session_id
        self.clock = clock
        self.records: list[dict[str, Any]] = []
        self._file: TextIO | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # closed in close()

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
