"""Keeps the user's input audio beside the session trace, so the trace can be replayed (`voiceagent replay`).

Opt-in (VOICEAGENT_RECORD_AUDIO=1, `voiceagent talk --record-audio`): the audio goes to a folder named
after the trace (`S.jsonl` -> `S.audio/`), one WAV per turn (PCM16 mono 16 kHz, as the session hears it).
A new file starts when the turn changes or when the input stops for more than `GAP_MS` (a client that sends
audio only while its mic is open). Each file's start is a `rec.audio` trace record:
`{"file": "S.audio/turn-001-00.wav", "t_ns": first frame, "sample_rate": 16000}`. The WAV header is
rewritten every `FLUSH_FRAMES` frames (soundfile's flush), so a killed server leaves files that play to
within 100 ms of their end (rewriting it at every frame cost 141 us a frame, bench/results/).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from voiceagent.audio import FRAME_MS, SAMPLE_RATE

GAP_MS = 200  # input silent this long (no frames at all) starts a new file: replay keeps the gap
FLUSH_FRAMES = 5  # the header is rewritten every 100 ms of audio


class AudioRecorder:
    """Writes each turn's input frames to its own WAV; `write_record(turn, t_ns=..., **data)` adds
    the `rec.audio` trace line (the trace names it)."""

    def __init__(self, directory: Path, write_record: Callable[..., Any]) -> None:
        self.directory = directory
        self.write_record = write_record
        self._file: soundfile.SoundFile | None = None
        self._turn = -1
        self._next_ns = 0  # when the frame after the last one is due
        self._files_in_turn = 0
        self._frames = 0  # written to the open file

    def push(self, frame: np.ndarray, t_ns: int, turn: int) -> None:
        """One frame of input audio: [320] int16 at 16 kHz, heard at `t_ns` during `turn`."""
        gap = self._file is not None and t_ns - self._next_ns > GAP_MS * 1_000_000
        if self._file is None or turn != self._turn or gap:
            self._open(t_ns, turn)
        assert self._file is not None
        self._file.write(frame)
        self._frames += 1
        if self._frames % FLUSH_FRAMES == 0:
            self._file.flush()  # rewrites the header: the file plays up to here even after a crash
        self._next_ns = t_ns + FRAME_MS * 1_000_000

    def _open(self, t_ns: int, turn: int) -> None:
        self.close()
        self._files_in_turn = self._files_in_turn + 1 if turn == self._turn else 0
        self._turn = turn
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"turn-{turn:03d}-{self._files_in_turn:02d}.wav"
        self._file = soundfile.SoundFile(path, "w", samplerate=SAMPLE_RATE, channels=1, subtype="PCM_16")
        self._frames = 0
        relative = f"{self.directory.name}/{path.name}"
        self.write_record(turn, t_ns=t_ns, file=relative, sample_rate=SAMPLE_RATE)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
