"""Moonshine base English behind the session's recogniser interface (`RecognizerLike`), on onnxruntime.

Moonshine (Useful Sensors, MIT) is an encoder-decoder like Whisper, but its encoder takes audio of any
length: there is no 30 s window to pad, so a pass over 2 s of speech encodes 2 s. Its model files come from
the `moonshine-cpp` wheel (voiceagent/speech_models.py prepares and checks them); that package's own native
library is never loaded, the `.ort` files run in the onnxruntime this project already uses.

`MoonshineRecognizer` re-decodes the utterance's audio on every `decode_partial` (greedy). With no word
timestamps, stability is LocalAgreement-2 on words: a word is stable once two consecutive passes agree on it
and on the word after it (a pass's last word may be cut off). `decode_final` reuses the last partial when it
heard the whole utterance (as `StreamingRecognizer` does), else decodes the audio up to just after the end
of speech once more; the final always begins with the last stable text. Repetition loops are undone as for
Whisper (voiceagent/asr_text.py).

Measured on a 2-core AVX2 EPYC (bench/results/2026-12-01-cpu-asr-real.md): accurate on real speech, but each
decoder step costs 50-90 ms on one core (the int8 weights are dequantised on every step by the `.ort`
graph), so a pass over a sentence takes about a second.
"""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

import numpy as np
import onnxruntime
import tokenizers

from voiceagent.asr import FINAL_MARGIN_S, Transcript
from voiceagent.asr_text import collapse_repeats, text_key, words_of
from voiceagent.audio import FRAME_MS, SAMPLE_RATE
from voiceagent.speech_models import prepare_speech_model
from voiceagent.utterance_audio import UtteranceAudio

__all__ = ["MoonshineModel", "MoonshineRecognizer", "load_moonshine"]

MODEL_NAME = "moonshine-base-en"
START_TOKEN, END_TOKEN = 1, 2
LAYERS, KV_HEADS, HEAD_DIM = 8, 8, 52  # Moonshine base's decoder
TOKENS_PER_S, EXTRA_TOKENS = (
    6.0,
    8,
)  # the reference's bound (6 per second of audio), plus a few for short audio
MIN_AUDIO_S = 0.1  # shorter input is too short for the encoder's convolutions
PRE_ROLL_MS = 400.0
FINAL_TAIL_S = 0.2  # audio kept after the end of speech for the final's own pass


class MoonshineModel:
    """The encoder and the merged decoder (with KV cache), and the tokenizer. Thread-safe for decoding."""

    def __init__(self, directory: Path) -> None:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = min(2, os.cpu_count() or 1)
        options.inter_op_num_threads = 1
        cpu = ["CPUExecutionProvider"]
        self.encoder = onnxruntime.InferenceSession(
            str(directory / "encoder_model.ort"), options, providers=cpu
        )
        self.decoder = onnxruntime.InferenceSession(
            str(directory / "decoder_model_merged.ort"), options, providers=cpu
        )
        self.tokenizer = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._past_names = [i.name for i in self.decoder.get_inputs() if i.name.startswith("past_key_values")]

    def transcribe(self, audio: np.ndarray) -> str:
        """audio: [n] float32 at 16 kHz -> its text (greedy; empty for too little audio)."""
        if audio.size < MIN_AUDIO_S * SAMPLE_RATE:
            return ""
        hidden = self.encoder.run(None, {"input_values": audio[np.newaxis, :].astype(np.float32)})[0]
        empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), dtype=np.float32)
        past = {name: empty for name in self._past_names}
        tokens: list[int] = []
        next_id = START_TOKEN
        for step in range(int(TOKENS_PER_S * audio.size / SAMPLE_RATE) + EXTRA_TOKENS):
            logits, *present = self.decoder.run(None, {
                "input_ids": np.array([[next_id]], dtype=np.int64),
                "encoder_hidden_states": hidden,
                "use_cache_branch": np.array([step > 0]),
                **past,
            })  # fmt: skip
            next_id = int(logits[0, -1].argmax())
            if next_id == END_TOKEN:
                break
            tokens.append(next_id)
            for name, value in zip(self._past_names, present, strict=True):
                if step == 0 or ".decoder." in name:  # the cross-attention keys stay those of step 0
                    past[name] = value
        text = self.tokenizer.decode(tokens)
        return "".join(collapse_repeats(words_of(text), text_key)).strip()


@functools.cache
def load_moonshine() -> MoonshineModel:
    """The process's shared Moonshine model (prepared from its packages and loaded on the first call)."""
    return MoonshineModel(prepare_speech_model(MODEL_NAME))


class MoonshineRecognizer:
    """One session's recogniser on Moonshine: `start`, `push` frames, `decode_partial`, `decode_final`."""

    def __init__(self, model: MoonshineModel | None = None, pre_roll_ms: float = PRE_ROLL_MS) -> None:
        self.model = model or load_moonshine()
        self.pre_roll_ms = pre_roll_ms
        self._audio = UtteranceAudio()  # push runs beside a decode: it has its own lock
        self._decode_lock = threading.Lock()
        self._reset_text()

    def _reset_text(self) -> None:
        self._stable: list[str] = []
        self._previous: list[str] = []  # the last pass's words
        self._last_end = 0  # samples heard by the last pass

    def start(self) -> None:
        """Begins an utterance with the last `pre_roll_ms` of audio pushed before."""
        keep = int(round(self.pre_roll_ms / FRAME_MS))
        with self._decode_lock:
            self._audio.start(keep)
            self._reset_text()

    def push(self, frame: np.ndarray) -> None:
        """Appends 20 ms of audio: [320] int16 PCM16 mono 16 kHz. Before start() it fills the pre-roll."""
        self._audio.push(frame)

    def decode_partial(self) -> Transcript:
        """Decodes the whole utterance so far; returns the stable prefix and the whole current guess."""
        with self._decode_lock:
            audio = self._audio.snapshot()
            words = self._with_stable(words_of(self.model.transcribe(audio)))
            keys, previous = [text_key(w) for w in words], [text_key(w) for w in self._previous]
            agreed = 0
            while agreed < min(len(keys), len(previous)) - 1 and keys[agreed] == previous[agreed]:
                agreed += 1  # ... and the word after it is in both passes too
            if agreed > len(self._stable):
                self._stable = words[:agreed]
            self._previous, self._last_end = words, audio.size
            return Transcript("".join(self._stable).strip(), "".join(words).strip())

    def decode_final(self, trailing_silence_ms: float = 0.0) -> str:
        """The utterance's transcript (begins with the last stable text); ends the utterance."""
        with self._decode_lock:
            audio = self._audio.snapshot()
            speech_end = audio.size - int(max(0.0, trailing_silence_ms) * SAMPLE_RATE / 1000)
            if self._last_end > 0 and self._last_end >= speech_end + FINAL_MARGIN_S * SAMPLE_RATE:
                words = self._previous
            else:  # the silence after the speech costs decoder time and adds nothing
                heard = audio[: speech_end + int(FINAL_TAIL_S * SAMPLE_RATE)]
                words = self._with_stable(words_of(self.model.transcribe(heard)))
            self._audio.end()
            self._reset_text()
            return "".join(words).strip()

    def _with_stable(self, words: list[str]) -> list[str]:
        """The pass's words after as many as are stable, behind the stable ones: a pass that heard a stable
        word otherwise does not change it (work begun on stable text stays valid)."""
        return self._stable + words[len(self._stable) :]
