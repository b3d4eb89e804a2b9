"""Streaming speech synthesis: a phrase in, mono int16 audio chunks out at the voice's native rate.

- `PiperSynthesizer` (the default) speaks with the bundled neural voice en_US-joe-medium (22.05 kHz) through
  piper-tts, an optional extra because it is GPL-3.0-or-later. Piper's network renders a whole sentence in
  one pass, so it streams one chunk per sentence; the phrase chunker keeps phrases short, which is what makes
  the first audio early. One loaded voice is shared by the whole process and is safe to use from threads.
- `EspeakSynthesizer` runs espeak-ng (a Debian package) as a subprocess and streams its WAV output as it is
  written: robotic, but its first audio comes within ~10 ms. The fallback voice, and the test voice.

`load_synthesizer("piper")` falls back to espeak-ng, with a warning, when piper-tts is not installed.
`synthesize` is a blocking generator: run it on a worker thread. Closing it early (a barge-in) stops the
work. `synthesize_at` streams the same audio resampled to another rate without seams between chunks.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import shutil
import struct
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Literal, Protocol, cast

import numpy as np
import soxr

from voiceagent.clock import Clock, MonotonicClock
from voiceagent.speech_models import PIPER_REQUIREMENT, VOICE_NAME, VoiceError, VoicePaths, checked_voice

if TYPE_CHECKING:
    from piper import PiperVoice

__all__ = [
    "EspeakSynthesizer",
    "PiperSynthesizer",
    "SynthesisTiming",
    "Synthesizer",
    "load_synthesizer",
    "measure_synthesizer",
    "synthesize_at",
]

_LOGGER = logging.getLogger(__name__)


class Synthesizer(Protocol):
    """Text to speech, streamed."""

    sample_rate: int  # the voice's native rate (Hz)
    name: str

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Mono int16 chunks of `text` spoken at `sample_rate`, the first as early as the engine allows."""
        ...


def _speakable(text: str) -> str:
    # Both engines read "[[...]]" as raw phoneme codes; the agent's text is never phonemes.
    return " ".join(text.replace("[[", "[ [").split())


class PiperSynthesizer:
    """The bundled Piper voice (one ONNX session; share one instance across sessions and threads)."""

    def __init__(self, voice: PiperVoice, name: str = f"piper:{VOICE_NAME}") -> None:
        self.voice = voice  # the piper-tts PiperVoice (its ONNX session and config)
        self.sample_rate: int = voice.config.sample_rate
        self.name = name

    @classmethod
    def load(cls, paths: VoicePaths | None = None, *, threads: int = 1) -> PiperSynthesizer:
        """Loads (and warms up) a voice; by default the bundled one, checked by sha256.

        `threads` is onnxruntime's intra-op thread count. One is the default: during a reply the engine is
        still decoding. On an idle 2-core CPU two threads cut a short phrase's first audio from ~110 to
        ~60 ms, but beside a running decode both give ~145 ms, and two slow the decode down more.
        Raises ImportError when piper-tts is not installed, VoiceError when the voice is missing or damaged.
        """
        import json

        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig

        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        paths = paths or checked_voice()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Its second thread does not spin waiting for work (as Moonshine's, voiceagent/moonshine.py). Spinning
        # went on after a phrase: the engine's next forward on the same two cores took 74-77 ms right after
        # one, 51-54 without the spin, 52-53 alone. Within a render it saves ~8 ms of a short phrase's first
        # audio on idle cores (113 against 121 ms with the spin stopped after each render), but costs 54
        # beside another busy thread (230 against 176 ms): the Xeon of the results, 2026-12-07.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = onnxruntime.InferenceSession(
            str(paths.model), sess_options=options, providers=["CPUExecutionProvider"]
        )
        config = PiperConfig.from_dict(json.loads(paths.config.read_text(encoding="utf-8")))
        synthesizer = cls(PiperVoice(session=session, config=config))
        for _ in synthesizer.synthesize("Hello."):  # the first run allocates: pay that at start-up
            pass
        return synthesizer

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """One chunk per sentence of `text` (Piper renders a sentence in one pass)."""
        text = _speakable(text)
        if not text:
            return
        for chunk in self.voice.synthesize(text):
            audio: np.ndarray = chunk.audio_int16_array
            if audio.size:
                yield audio


_RIFF_HEADER = struct.Struct("<4sI4s")
_CHUNK_HEADER = struct.Struct("<4sI")
_FMT = struct.Struct("<HHIIHH")  # format, channels, rate, byte rate, block align, bits per sample


def _read_exactly(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise VoiceError(f"espeak-ng ended its WAV output early ({len(data)} of {n} header bytes)")
    return data


def _read_wav_header(stream: IO[bytes]) -> int:
    """Reads a streamed WAV header up to the start of its samples; returns the sample rate."""
    riff, _, wave = _RIFF_HEADER.unpack(_read_exactly(stream, _RIFF_HEADER.size))
    if riff != b"RIFF" or wave != b"WAVE":
        raise VoiceError("espeak-ng did not write a WAV stream")
    rate = 0
    while True:
        chunk_id, size = _CHUNK_HEADER.unpack(_read_exactly(stream, _CHUNK_HEADER.size))
        if chunk_id == b"data":  # its size is a placeholder in a stream: read until the end
            if rate == 0:
                raise VoiceError("espeak-ng's WAV stream has no format chunk")
            return rate
        body = _read_exactly(stream, size + (size & 1))
        if chunk_id == b"fmt ":
            audio_format, channels, rate, _, _, bits = _FMT.unpack(body[: _FMT.size])
            if (audio_format, channels, bits) != (1, 1, 16):
                raise VoiceError(f"espeak-ng wrote {channels}-channel {bits}-bit format {audio_format}")


class EspeakSynthesizer:
    """espeak-ng as a subprocess, its `--stdout` WAV streamed in chunks of at least `chunk_ms`."""

    def __init__(
        self,
        voice: str = "en-us",
        words_per_minute: int = 175,
        *,
        chunk_ms: int = 100,
        executable: str | None = None,
    ) -> None:
        """Finds espeak-ng and probes its output rate; VoiceError if it is missing or lacks `voice`."""
        found = executable or shutil.which("espeak-ng")
        if found is None:
            raise VoiceError("espeak-ng is not installed: apt-get install espeak-ng")
        if not 80 <= words_per_minute <= 450:
            raise ValueError(
                f"words_per_minute must be in 80..450 (espeak-ng accepts), got {words_per_minute}"
            )
        self._command = [found, "--stdout", "-v", voice, "-s", str(words_per_minute)]
        self._chunk_ms = chunk_ms
        self.name = f"espeak-ng:{voice}"
        self.sample_rate = 0
        probe = subprocess.run(self._command, input=b"a", capture_output=True, check=False)
        if probe.returncode != 0 or len(probe.stdout) < 44:
            message = probe.stderr.decode(errors="replace").strip() or f"exit status {probe.returncode}"
            raise VoiceError(f"espeak-ng cannot speak with voice {voice!r}: {message}")
        self.sample_rate = struct.unpack_from("<I", probe.stdout, 24)[0]

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Chunks as espeak-ng writes them (it writes audio long before it has spoken the whole text)."""
        text = _speakable(text)
        if not text:
            return
        process = subprocess.Popen(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        try:
            process.stdin.write(text.encode("utf-8"))
            process.stdin.close()
            stdout = cast(io.BufferedReader, process.stdout)  # read1: whatever has arrived, without waiting
            rate = _read_wav_header(stdout)
            min_bytes = 2 * max(1, rate * self._chunk_ms // 1000)
            pending = b""
            while data := stdout.read1(1 << 16):
                pending += data
                if len(pending) >= min_bytes:
                    usable = len(pending) - len(pending) % 2
                    yield np.frombuffer(pending[:usable], dtype="<i2").astype(np.int16)
                    pending = pending[usable:]
            if len(pending) >= 2:
                yield np.frombuffer(pending[: len(pending) - len(pending) % 2], dtype="<i2").astype(np.int16)
            if process.wait() != 0:
                error = process.stderr.read().decode(errors="replace").strip()
                raise VoiceError(f"espeak-ng failed (exit status {process.returncode}): {error}")
        finally:  # also when the consumer stops early: do not leave the process speaking to nobody
            if not process.stdin.closed:
                with contextlib.suppress(OSError):  # it died before reading the text
                    process.stdin.close()
            if process.poll() is None:
                process.kill()
            process.wait()
            process.stdout.close()
            process.stderr.close()


@functools.cache
def _shared_piper(threads: int) -> PiperSynthesizer:
    return PiperSynthesizer.load(threads=threads)


def load_synthesizer(name: Literal["piper", "espeak"] = "piper", *, threads: int = 1) -> Synthesizer:
    """The named synthesizer. "piper" is loaded once per process and shared; without piper-tts installed
    it falls back to espeak-ng with a logged warning. Raises VoiceError naming what to install when no
    engine works, or when the bundled voice is damaged."""
    if name == "espeak":
        return EspeakSynthesizer()
    if name != "piper":
        raise ValueError(f"unknown synthesizer {name!r}: use 'piper' or 'espeak'")
    try:
        return _shared_piper(threads)
    except ImportError as error:
        piper_error = error
    try:
        synthesizer = EspeakSynthesizer()
    except VoiceError as error:
        raise VoiceError(
            "no speech synthesizer works: install piper-tts for the neural voice (the GPL extra: "
            f"pip install 'voiceagent[piper]', i.e. {PIPER_REQUIREMENT}) or espeak-ng "
            f"(apt-get install espeak-ng). piper: {piper_error}; espeak-ng: {error}"
        ) from error
    _LOGGER.warning(
        "piper-tts is not installed (%s): speaking with espeak-ng; install the neural voice with "
        "pip install 'voiceagent[piper]'",
        piper_error,
    )
    return synthesizer


def synthesize_at(synthesizer: Synthesizer, text: str, rate: int) -> Iterator[np.ndarray]:
    """`synthesizer.synthesize(text)` resampled to `rate` by one streaming soxr filter, so chunk boundaries
    leave no seams (resampling each chunk on its own restarts the filter at every chunk)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    chunks = synthesizer.synthesize(text)
    if rate == synthesizer.sample_rate:
        yield from chunks
        return
    stream = soxr.ResampleStream(synthesizer.sample_rate, rate, 1, dtype="int16", quality="HQ")
    for chunk in chunks:
        out = stream.resample_chunk(chunk)
        if out.size:
            yield out
    tail = stream.resample_chunk(np.zeros(0, dtype=np.int16), last=True)
    if tail.size:
        yield tail


@dataclass(frozen=True)
class SynthesisTiming:
    """How fast a synthesizer speaks a set of phrases (medians over them)."""

    name: str
    first_audio_ms: float  # from the call to the first chunk
    real_time_factor: float  # synthesis time / audio duration
    audio_s: float  # total audio produced


def measure_synthesizer(
    synthesizer: Synthesizer, texts: Iterable[str], clock: Clock | None = None
) -> SynthesisTiming:
    """Times each text's first chunk and whole synthesis (for benchmarks; not a test)."""
    clock = clock or MonotonicClock()
    first_ms: list[float] = []
    factors: list[float] = []
    total_samples = 0
    for text in texts:
        start = clock.now_ns()
        first: int | None = None
        samples = 0
        for chunk in synthesizer.synthesize(text):
            first = clock.now_ns() if first is None else first
            samples += chunk.size
        if first is None:
            raise ValueError(f"{synthesizer.name} produced no audio for {text!r}")
        first_ms.append((first - start) / 1e6)
        factors.append((clock.now_ns() - start) / 1e9 / (samples / synthesizer.sample_rate))
        total_samples += samples
    return SynthesisTiming(
        synthesizer.name,
        float(np.median(first_ms)),
        float(np.median(factors)),
        total_samples / synthesizer.sample_rate,
    )
