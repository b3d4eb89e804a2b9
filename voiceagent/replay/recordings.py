"""The input audio a trace recorded (voiceagent/recording.py), put back together per session for a replay.

Each `rec.audio` record names a WAV beside the trace and the `t_ns` of its first frame. A session's files are
laid end to end on one timeline; where a file started later than the one before it ended (the client sent
nothing for a while: the recorder starts a new file after `GAP_MS`), the gap becomes silence, so the replay
keeps the recorded pace. The recorded ends of speech come along, as seconds on that timeline, for replays
whose far end says nothing of its own VAD (a Twilio stream).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from voiceagent.audio import SAMPLE_RATE, read_wav
from voiceagent.recording import GAP_MS
from voiceagent.trace import REC_AUDIO, VAD_SPEECH_END


@dataclass
class Recording:
    """One session's recorded input: [n] int16 at 16 kHz from its first recorded frame."""

    session: str
    audio: np.ndarray
    start_ns: int
    speech_ends: dict[int, float] = field(default_factory=dict)  # turn -> seconds from the first frame
    problems: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


def recordings(records: list[dict[str, Any]], trace_path: Path) -> list[Recording]:
    """Every session of the trace that recorded audio, in the order its recording started."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if record.get("event") == REC_AUDIO and isinstance(record.get("file"), str):
            by_session.setdefault(str(record.get("session", "")), []).append(record)
    found = [
        _session_recording(session, files, records, trace_path.parent)
        for session, files in by_session.items()
    ]
    return sorted((r for r in found if r is not None), key=lambda r: r.start_ns)


def _session_recording(
    session: str, files: list[dict[str, Any]], records: list[dict[str, Any]], folder: Path
) -> Recording | None:
    files = sorted(files, key=lambda r: int(r["t_ns"]))
    pieces: list[np.ndarray] = []
    starts: list[tuple[int, int]] = []  # (t_ns of a file's first frame, its sample offset on the timeline)
    problems: list[str] = []
    end_ns = offset = 0  # when the previous file's audio ran out; samples laid so far
    for record in files:
        path, t_ns = folder / record["file"], int(record["t_ns"])
        try:
            audio = _read_recorded(path)
        except (OSError, ValueError) as error:  # missing, or not audio (read_wav says which)
            problems.append(
                f"session {session}: recorded audio {record['file']} unreadable ({error}), skipped"
            )
            audio = np.zeros(0, dtype=np.int16)  # its time still counts: silence until the next file
        if starts and t_ns - end_ns > GAP_MS * 1_000_000:  # the client paused: keep the pause
            pieces.append(np.zeros(round((t_ns - end_ns) / 1e9 * SAMPLE_RATE), dtype=np.int16))
            offset += len(pieces[-1])
        starts.append((t_ns, offset))
        pieces.append(audio)
        offset += len(audio)
        end_ns = t_ns + round(len(audio) / SAMPLE_RATE * 1e9)
    if not any(len(piece) for piece in pieces):
        return None
    ends = {
        int(r["turn"]): _timeline_seconds(int(r["t_ns"]), starts)
        for r in records
        if r.get("event") == VAD_SPEECH_END and str(r.get("session", "")) == session
    }
    return Recording(session, np.concatenate(pieces), starts[0][0], ends, problems)


def _timeline_seconds(t_ns: int, starts: list[tuple[int, int]]) -> float:
    """Where a recorded time falls on the timeline: in the last file that started before it."""
    start_ns, offset = next(((s, o) for s, o in reversed(starts) if s <= t_ns), starts[0])
    return offset / SAMPLE_RATE + (t_ns - start_ns) / 1e9


def _read_recorded(path: Path) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return read_wav(path)  # 16 kHz mono as recorded (a converted copy is brought back to it)
