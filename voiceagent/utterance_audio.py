"""One utterance's audio for a streaming recogniser: the frames since `start`, with a pre-roll ring before.

Every recogniser (voiceagent/asr.py's Whisper, voiceagent/moonshine.py) keeps audio the same way: frames
pushed before an utterance fill a 1 s ring (the VAD decides a start only after some voiced audio, so the
start of the first word is already behind it), `start(keep_frames)` opens the utterance with the last of
them, `snapshot` hands a decode the audio so far, `end` closes it. `push` may run on the event loop while a
decode takes a snapshot in a worker thread: the buffer has its own lock.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from voiceagent.audio import FRAME_SAMPLES, to_float

RING_FRAMES = 50  # 1 s of audio kept before start(): the most pre-roll one can ask for


class UtteranceAudio:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ring: deque[np.ndarray] = deque(maxlen=RING_FRAMES)
        self._frames: list[np.ndarray] = []
        self._active = False

    def start(self, keep_frames: int) -> None:
        """Opens an utterance with the last `keep_frames` frames pushed before (0..RING_FRAMES)."""
        with self._lock:
            self._frames = list(self._ring)[len(self._ring) - keep_frames :] if keep_frames else []
            self._ring.clear()
            self._active = True

    def push(self, frame: np.ndarray) -> None:
        """Appends 20 ms of audio: [320] int16 PCM16 mono 16 kHz. Before start() it fills the pre-roll."""
        if not isinstance(frame, np.ndarray) or frame.dtype != np.int16 or frame.shape != (FRAME_SAMPLES,):
            got = f"{frame.dtype} {frame.shape}" if isinstance(frame, np.ndarray) else type(frame).__name__
            raise ValueError(f"a frame must be [{FRAME_SAMPLES}] int16 (20 ms at 16 kHz), got {got}")
        with self._lock:
            (self._frames if self._active else self._ring).append(frame.copy())

    def snapshot(self) -> np.ndarray:
        """The utterance's audio so far: [n] float32 at 16 kHz."""
        with self._lock:
            if not self._active:
                raise RuntimeError("no utterance: call start() first")
            frames = list(self._frames)
        return to_float(np.concatenate(frames)) if frames else np.zeros(0, dtype=np.float32)

    def end(self) -> None:
        """Closes the utterance: frames pushed from now on fill the pre-roll again."""
        with self._lock:
            self._active = False
            self._frames = []
