"""Moonshine base English behind the session's recogniser interface (`RecognizerLike`), on onnxruntime.

Moonshine (Useful Sensors, MIT) is an encoder-decoder like Whisper, but its encoder takes audio of any
length: there is no 30 s window to pad, so a pass over 2 s of speech encodes 2 s. Its model files come from
the `moonshine-cpp` wheel (voiceagent/speech_models.py prepares and checks them); that package's own native
library is never loaded, the `.ort` files run in the onnxruntime this project already uses.

`MoonshineRecognizer` re-decodes the utterance's audio on every `decode_partial` (greedy), with the last
pass's tokens as a draft: one decoder call checks them all, and steps go on only after the first token the
new pass would not have chosen (`MoonshineModel.greedy_tokens`; the tokens are those of plain greedy
decoding). With no word timestamps, stability is LocalAgreement-2 on words: a word is stable once two
consecutive passes agree on it and on the word after it (a pass's last word may be cut off). `decode_final`
reuses the last partial when it heard the whole utterance (as `StreamingRecognizer` does), else decodes the
audio up to just after the end of speech once more (drafted too); the final always begins with the last
stable text. Repetition loops are undone as for Whisper (voiceagent/asr_text.py).

The shipped `.ort` graphs dequantise their int8 weights on every run (onnxruntime does not constant-fold an
`.ort` model): 63-70 ms a decoder step on a 2-core AVX2 EPYC. `load_moonshine` runs them rebuilt once as
float ONNX graphs instead (voiceagent/moonshine_graph.py: the same weights bit for bit, the same outputs
with the same kernels): 11-13 ms a step (quiet; 17-23 under load, against 77-117), a whole pass 3.2-3.6x
faster, and with a draft a final pass over the 13 real clips costs 0.7-0.95x Whisper tiny.en's; the same
transcripts on all 13 (bench/results/2026-12-01-cpu-moonshine-speed.md). The shipped graphs stay the
reference: `MoonshineModel(moonshine_graph.ort_graphs(directory), tokenizer)`.

The decoder runs its weight MatMuls in int8 where that is faster (moonshine_graph.py's int8 decoder: the same
weights, int8 activations): on the 2-core AVX-512 Xeon a step costs 6-8 ms instead of 12-17, a drafted
pass over a question 5-20 ms less, with the same transcripts on the real clips and 314 of 318 passes token
for token (bench/results/2026-12-07-cpu-xeon-amx-167-moonshine-int8.md). Where onnxruntime has no int8
kernel for the CPU it would dequantise every weight on every call (~10x slower), and kernels without VNNI
(a plain AVX2 CPU) are not measured: `MoonshineModel` times two steps of the int8 decoder when it loads,
and if a step took over `COMPARE_ABOVE_MS` (more than the float decoder's step on the CPUs measured) it
times the float decoder too and keeps the faster.
`VOICEAGENT_MOONSHINE_DECODER=float` (or `int8`) chooses without the probe.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, cast

import numpy as np
import onnxruntime
import tokenizers

from voiceagent.asr import Transcript
from voiceagent.asr_text import collapse_repeats, text_key, words_of
from voiceagent.audio import FRAME_MS, SAMPLE_RATE
from voiceagent.moonshine_graph import MoonshineGraphs, float_graphs
from voiceagent.speech_models import prepare_speech_model
from voiceagent.stages import FINAL_MARGIN_S, PartialStopped
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
COMPARE_ABOVE_MS = 12.0  # int8 steps 6-8 ms on the AVX-512 Xeon; float 12-17 there, 11-13 on an AVX2 EPYC
PROBE_FRAMES = 50  # encoder states (~1.2 s of audio) the load-time probe decodes against
DecoderKind = Literal["auto", "int8", "float"]
DECODER_KINDS: tuple[DecoderKind, ...] = ("auto", "int8", "float")

log = logging.getLogger(__name__)


def pick_probability(logits: np.ndarray) -> float:
    """The softmax probability of the largest of `logits` [V]: how sure greedy decoding was of its pick."""
    return float(1.0 / np.exp(logits - logits.max()).sum())


class MoonshineModel:
    """The encoder and the merged decoder (with KV cache), and the tokenizer. Thread-safe for decoding."""

    def __init__(self, graphs: MoonshineGraphs, tokenizer: Path, decoder: DecoderKind = "auto") -> None:
        """`decoder`: "auto" runs the int8 decoder unless the graphs have none, or its load-time probe step
        is over COMPARE_ABOVE_MS and the float decoder's step is faster; "int8" and "float" choose without a
        probe."""
        self.encoder = open_session(graphs.encoder)
        self.tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer))
        if decoder == "int8" and graphs.int8_decoder is None:
            raise ValueError("these graphs have no int8 decoder")
        int8 = graphs.int8_decoder if decoder != "float" else None
        self.decoder_kind: Literal["int8", "float"] = "float" if int8 is None else "int8"
        self.decoder = open_session(int8 or graphs.decoder)
        self._past_names = [i.name for i in self.decoder.get_inputs() if i.name.startswith("past_key_values")]
        self.probe_step_ms: dict[str, float] = {}  # what "auto" measured: the int8 step, and the float one
        if decoder == "auto" and int8 is not None:
            self._keep_the_faster_decoder(graphs.decoder)

    def _keep_the_faster_decoder(self, float_decoder: Path) -> None:
        """The int8 decoder is loaded: time its step; over COMPARE_ABOVE_MS, time the float decoder's too and
        keep whichever was faster."""
        self.probe_step_ms["int8"] = self.step_ms()
        if self.probe_step_ms["int8"] <= COMPARE_ABOVE_MS:
            return
        int8 = self.decoder
        self.decoder = open_session(float_decoder)
        self.probe_step_ms["float"] = self.step_ms()
        if self.probe_step_ms["float"] < self.probe_step_ms["int8"]:
            self.decoder_kind = "float"
            message = "Moonshine's decoder step: int8 %.1f ms, float %.1f ms on this CPU: using the float one"
            log.warning(message, self.probe_step_ms["int8"], self.probe_step_ms["float"])
        else:
            self.decoder = int8

    def step_ms(self, steps: int = 2) -> float:
        """The least time of `steps` decoder steps after a first call, against zero encoder states."""
        hidden = np.zeros((1, PROBE_FRAMES, self.encoder.get_outputs()[0].shape[-1]), dtype=np.float32)
        cache = self.empty_cache()
        self.decode(hidden, cache, [START_TOKEN])
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            self.decode(hidden, cache, [START_TOKEN])
            times.append((time.perf_counter() - started) * 1e3)
        return min(times)

    def transcribe(self, audio: np.ndarray, draft: Sequence[int] = ()) -> str:
        """audio: [n] float32 at 16 kHz -> its text (greedy; empty for too little audio)."""
        return self.text_of(self.heard_tokens(audio, draft))

    def heard_tokens(
        self,
        audio: np.ndarray,
        draft: Sequence[int] = (),
        picked: list[float] | None = None,
        stop: threading.Event | None = None,
    ) -> list[int]:
        """audio: [n] float32 at 16 kHz -> the greedy token ids of its text (none for too little audio).
        `draft`: the tokens an earlier pass heard, checked all at once; `picked`, `stop`: see
        `greedy_tokens`."""
        if audio.size < MIN_AUDIO_S * SAMPLE_RATE:
            return []
        max_tokens = int(TOKENS_PER_S * audio.size / SAMPLE_RATE) + EXTRA_TOKENS
        return self.greedy_tokens(self.encode(audio), max_tokens, draft, picked, stop)

    def heard(
        self, audio: np.ndarray, draft: Sequence[int] = (), stop: threading.Event | None = None
    ) -> tuple[list[int], float | None]:
        """As `heard_tokens`, with the decoder's confidence in them: the least probability it gave any of
        its picks (None: no tokens). Only a partial asks (the final's pass has no use for it)."""
        picked: list[float] = []
        tokens = self.heard_tokens(audio, draft, picked, stop)
        return tokens, (min(picked) if picked else None)

    def text_of(self, tokens: Sequence[int]) -> str:
        """Token ids -> text, with repetition loops undone."""
        text = self.tokenizer.decode(list(tokens))
        return "".join(collapse_repeats(words_of(text), text_key)).strip()

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """audio: [n] float32 at 16 kHz -> the encoder's states [1, frames, 416] (~41 frames a second)."""
        assert audio.ndim == 1 and audio.size >= MIN_AUDIO_S * SAMPLE_RATE, audio.shape
        return self.encoder.run(None, {"input_values": audio[np.newaxis, :].astype(np.float32)})[0]

    def greedy_tokens(
        self,
        hidden: np.ndarray,
        max_tokens: int,
        draft: Sequence[int] = (),
        picked: list[float] | None = None,
        stop: threading.Event | None = None,
    ) -> list[int]:
        """The text's token ids, greedy, up to the end token or `max_tokens`.

        The first decoder call reads the start token and the whole `draft` at once (as one step costs: the
        weights are read once): its logits say which token greedy decoding picks after each draft prefix. The
        draft is accepted up to its first token that is not the pick, the pick there is the bonus token, and
        the steps go on from it. The tokens are those of decoding without a draft (the logits of a batched
        call match a step's to ~2e-5 in float, a probability point in int8), at the cost of one call plus a
        step per token after the accepted ones.
        `picked`, if given, receives the probability of each token returned. Once `stop` is set, the next
        decoder call raises `PassStopped` instead (a step is ~11 ms: the pass ends within one).
        """
        cache = self.empty_cache()
        _check(stop, [])
        draft = list(draft[:max_tokens])
        logits = self.decode(hidden, cache, [START_TOKEN, *draft])  # [len(draft) + 1, V]
        picks = logits.argmax(axis=-1)
        accepted = 0
        while accepted < len(draft) and draft[accepted] == picks[accepted] != END_TOKEN:
            accepted += 1
        self._keep_positions(cache, accepted + 1)  # the start token and the accepted ones
        tokens, next_id, row = draft[:accepted], int(picks[accepted]), logits[accepted]
        if picked is not None:
            picked.extend(pick_probability(logits[i]) for i in range(accepted))
        while next_id != END_TOKEN and len(tokens) < max_tokens:
            tokens.append(next_id)
            if picked is not None:
                picked.append(pick_probability(row))
            _check(stop, tokens)
            row = self.decode(hidden, cache, [next_id])[-1]
            next_id = int(row.argmax())
        return tokens

    def empty_cache(self) -> dict[str, np.ndarray]:
        """The decoder's key/value inputs before the first call: [1, 8 heads, 0, 52] each."""
        empty = np.zeros((1, KV_HEADS, 0, HEAD_DIM), dtype=np.float32)
        return {name: empty for name in self._past_names}

    def decode(self, hidden: np.ndarray, cache: dict[str, np.ndarray], token_ids: list[int]) -> np.ndarray:
        """One decoder call: the logits after each of `token_ids` [len, 32768]; `cache` is updated.

        The first call (empty cache, any number of tokens) computes the cross-attention keys/values from
        `hidden`; later calls (one token each) take the graph's cache branch, which reads them from `cache`
        and outputs empty ones in their place, so only the self-attention entries (".decoder.") change."""
        first = cache[self._past_names[0]].shape[2] == 0
        assert token_ids and (first or len(token_ids) == 1), token_ids
        logits, *present = self.decoder.run(None, {
            "input_ids": np.array([token_ids], dtype=np.int64),
            "encoder_hidden_states": hidden,
            "use_cache_branch": np.array([not first]),
            **cache,
        })  # fmt: skip
        for name, value in zip(self._past_names, present, strict=True):
            if first or ".decoder." in name:
                cache[name] = value
        return logits[0]

    def _keep_positions(self, cache: dict[str, np.ndarray], positions: int) -> None:
        """Drops the self-attention entries after the first `positions` tokens (rejected draft tokens)."""
        for name, value in cache.items():
            if ".decoder." in name and value.shape[2] > positions:
                cache[name] = np.ascontiguousarray(value[:, :, :positions])


class PassStopped(PartialStopped):
    """A pass stopped at a decoder call, with the tokens it had decoded (greedy for its audio: a draft for
    the next pass; none if it stopped before its first decoder call)."""

    def __init__(self, tokens: list[int]) -> None:
        super().__init__(f"the pass was stopped after {len(tokens)} tokens")
        self.tokens = tokens


def _check(stop: threading.Event | None, tokens: list[int]) -> None:
    if stop is not None and stop.is_set():
        raise PassStopped(tokens)


def open_session(path: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = min(2, os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    # A spinning second thread doubled the step (17 -> 33 ms) with another process on one of two cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@functools.cache
def load_moonshine() -> MoonshineModel:
    """The process's shared Moonshine model on its rebuilt graphs, the int8 decoder where it is faster
    (prepared from its packages, and the graphs built, on the first call ever; loaded on the first call in a
    process)."""
    directory = prepare_speech_model(MODEL_NAME)
    return MoonshineModel(float_graphs(directory), directory / "tokenizer.json", decoder_from_environment())


def decoder_from_environment() -> DecoderKind:
    """`$VOICEAGENT_MOONSHINE_DECODER` (auto, int8 or float; unset: auto)."""
    chosen = os.environ.get("VOICEAGENT_MOONSHINE_DECODER") or "auto"
    if chosen not in DECODER_KINDS:
        expected = ", ".join(DECODER_KINDS)
        raise ValueError(f"VOICEAGENT_MOONSHINE_DECODER={chosen!r}: expected one of {expected}")
    return cast(DecoderKind, chosen)


class MoonshineRecognizer:
    """One session's recogniser on Moonshine: `start`, `push` frames, `decode_partial`, `decode_final`."""

    def __init__(self, model: MoonshineModel | None = None, pre_roll_ms: float = PRE_ROLL_MS) -> None:
        self.model = model or load_moonshine()
        self.pre_roll_ms = pre_roll_ms
        self._audio = UtteranceAudio()  # push runs beside a decode: it has its own lock
        self._decode_lock = threading.Lock()
        self._stop_lock = threading.Lock()  # guards `_stop`: set only while a partial decodes
        self._stop: threading.Event | None = None
        self._reset_text()

    def _reset_text(self) -> None:
        self._stable: list[str] = []
        self._previous: list[str] = []  # the last pass's words
        self._draft: list[int] = []  # ... and its tokens: the next pass checks them all in one decoder call
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
        """Decodes the whole utterance so far; returns the stable prefix and the whole current guess.
        Raises `PartialStopped` if `stop_partial` ends it first: only the tokens it decoded are kept, as
        the next pass's draft (its words are not, nor is anything stable)."""
        with self._decode_lock:
            audio = self._audio.snapshot()
            with self._stop_lock:
                self._stop = stop = threading.Event()
            try:
                self._draft, confidence = self.model.heard(audio, self._draft, stop)
            except PassStopped as stopped:  # what it decoded is greedy for its audio: a draft for the next
                self._draft = stopped.tokens or self._draft
                raise
            finally:
                with self._stop_lock:
                    self._stop = None
            words = self._with_stable(words_of(self.model.text_of(self._draft)))
            keys, previous = [text_key(w) for w in words], [text_key(w) for w in self._previous]
            agreed = 0
            while agreed < min(len(keys), len(previous)) - 1 and keys[agreed] == previous[agreed]:
                agreed += 1  # ... and the word after it is in both passes too
            if agreed > len(self._stable):
                self._stable = words[:agreed]
            self._previous, self._last_end = words, audio.size
            return Transcript("".join(self._stable).strip(), "".join(words).strip(), audio, confidence)

    def stop_partial(self) -> None:
        """Ends the partial being decoded at its next decoder call (it raises `PartialStopped`); nothing if
        none is decoding (one still waiting for the lock runs in full)."""
        with self._stop_lock:
            if self._stop is not None:
                self._stop.set()

    def decode_final(self, trailing_silence_ms: float = 0.0) -> str:
        """The utterance's transcript (begins with the last stable text); ends the utterance."""
        with self._decode_lock:
            audio = self._audio.snapshot()
            speech_end = audio.size - int(max(0.0, trailing_silence_ms) * SAMPLE_RATE / 1000)
            if self._last_end > 0 and self._last_end >= speech_end + FINAL_MARGIN_S * SAMPLE_RATE:
                words = self._previous
            else:  # the silence after the speech costs decoder time and adds nothing
                heard = audio[: speech_end + int(FINAL_TAIL_S * SAMPLE_RATE)]
                tokens = self.model.heard_tokens(heard, self._draft)
                words = self._with_stable(words_of(self.model.text_of(tokens)))
            self._audio.end()
            self._reset_text()
            return "".join(words).strip()

    def _with_stable(self, words: list[str]) -> list[str]:
        """The pass's words after as many as are stable, behind the stable ones: a pass that heard a stable
        word otherwise does not change it (work begun on stable text stays valid). A pass that read the
        stable words as fewer ("for my new puppy" as "for Manu Perpi", with more silence after it) has
        nothing past them, though the last pass had: that pass's words after the stable ones stand."""
        n = len(self._stable)
        keys, stable_keys = [text_key(w) for w in words], [text_key(w) for w in self._stable]
        if len(words) <= n and keys != stable_keys[: len(keys)] and self._previous[n:]:
            return self._stable + self._previous[n:]
        return self._stable + words[n:]
