"""Smart Turn v3.2: P(the user's turn is complete) from the sound of its last 8 s (prosody, not words).

Daily's end-of-turn audio model (BSD-2-Clause; the ONNX file inside the `pipecat-ai` wheel, prepared by
`voiceagent models prepare`), as Pipecat runs it: the turn's audio at 16 kHz, cut to its last 8 s or padded
with silence before it to 8 s, as a Whisper log-mel spectrogram (80 bins, 800 frames, the waveform
normalised to zero mean and unit variance first) -> one probability. ~30 ms an inference on one core.

On its own it calls most mid-sentence pauses of a generated voice complete ("Could you remind me to?" 0.98),
which is why Pipecat cuts 72-78% of them (bench/turn_taking). The session uses it only beside the text
score of the words (voiceagent/turn_taking.py `fused_score`): it tips the draft's verdict where the words
alone look unfinished but the voice fell as at the end of a question.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from voiceagent.audio import SAMPLE_RATE

if TYPE_CHECKING:
    from transformers import WhisperFeatureExtractor

__all__ = ["WINDOW_S", "SmartTurn", "last_window"]

WINDOW_S = 8  # the model's input: the last 8 s of the turn


def last_window(audio: np.ndarray) -> np.ndarray:
    """[n] float32 16 kHz -> [WINDOW_S * 16000]: its last 8 s, or silence before it up to 8 s."""
    size = WINDOW_S * SAMPLE_RATE
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if audio.size >= size:
        return audio[-size:]
    return np.concatenate([np.zeros(size - audio.size, dtype=np.float32), audio])


@functools.cache
def _features() -> WhisperFeatureExtractor:
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(chunk_length=WINDOW_S)


class SmartTurn:
    """One ONNX Runtime session of the model (thread-safe for `probability`; one intra-op thread), warmed
    by one inference on 1 s of silence (the first call loads the feature extractor: ~1-3 s), so no turn
    pays for it."""

    def __init__(self, path: Path | str | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        if path is None:
            from voiceagent.speech_models import smart_turn_path

            path = smart_turn_path()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self._session: Any = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._input = self._session.get_inputs()[0].name
        self.probability(np.zeros(SAMPLE_RATE, dtype=np.float32))

    def probability(self, audio: np.ndarray) -> float:
        """P(turn complete) for a turn's audio so far: [n] float32 in [-1, 1] at 16 kHz (n >= 1)."""
        if np.size(audio) == 0:
            raise ValueError("Smart Turn needs some audio, got none")
        features = _features()(
            last_window(audio), sampling_rate=SAMPLE_RATE, do_normalize=True, return_tensors="np"
        ).input_features  # [1, 80, 800] float32
        (out,) = self._session.run(None, {self._input: features.astype(np.float32)})
        return float(np.asarray(out).reshape(-1)[0])
