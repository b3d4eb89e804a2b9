"""Audio inside the pipeline is PCM16 mono 16 kHz in 20 ms frames; this module converts everything else.

Resampling uses soxr (a maintained, high-quality resampler), files go through soundfile (any WAV rate and
channel count), and G.711 mu-law (phone lines, 8 kHz) is done in numpy, since `audioop` left Python 3.13.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile
import soxr

SAMPLE_RATE = 16000
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 320

_MULAW_BIAS = 0x84
_MULAW_CLIP = 32635


def to_float(pcm16: np.ndarray) -> np.ndarray:
    """int16 -> float32 in [-1, 1)."""
    return pcm16.astype(np.float32) / 32768.0


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """float in [-1, 1] -> int16 (clipped)."""
    return np.clip(np.round(samples * 32768.0), -32768, 32767).astype(np.int16)


def to_mono(pcm16: np.ndarray) -> np.ndarray:
    """int16 [n] or [n, channels] -> [n], averaging the channels."""
    if pcm16.ndim == 1:
        return pcm16
    if pcm16.ndim != 2:
        raise ValueError(f"audio must be [samples] or [samples, channels], got shape {pcm16.shape}")
    return pcm16[:, 0] if pcm16.shape[1] == 1 else to_pcm16(to_float(pcm16).mean(axis=1))


def resample(pcm16: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Mono int16 from one rate to another (soxr, high quality)."""
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {from_rate} -> {to_rate}")
    if from_rate == to_rate or pcm16.size == 0:
        return pcm16.astype(np.int16, copy=False)
    return to_pcm16(soxr.resample(to_float(pcm16), from_rate, to_rate, quality="HQ"))


def _mulaw_encode_formula(pcm16: np.ndarray) -> np.ndarray:
    """G.711 mu-law by its formula: int16 samples -> uint8 codes."""
    x = pcm16.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(x), _MULAW_CLIP) + _MULAW_BIAS
    exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 7  # 0..7
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8)


def _mulaw_decode_formula(codes: np.ndarray) -> np.ndarray:
    """G.711 mu-law by its formula: uint8 codes -> int16 samples."""
    b = ~codes.astype(np.int32) & 0xFF
    exponent = (b >> 4) & 0x07
    magnitude = (((b & 0x0F) << 3) + _MULAW_BIAS) << exponent
    return np.where(b & 0x80, _MULAW_BIAS - magnitude, magnitude - _MULAW_BIAS).astype(np.int16)


# Phone audio is converted 50 times a second per call in each direction: table lookups cost a fraction of the
# formulas' numpy passes on 160 samples. Encoding indexes by the sample's 16 bits (as uint16).
_MULAW_ENCODE_TABLE = _mulaw_encode_formula(np.arange(65536, dtype=np.uint16).view(np.int16))
_MULAW_DECODE_TABLE = _mulaw_decode_formula(np.arange(256, dtype=np.uint8))


def mulaw_encode(pcm16: np.ndarray) -> bytes:
    """G.711 mu-law: int16 samples -> one byte each."""
    return _MULAW_ENCODE_TABLE[np.asarray(pcm16, dtype=np.int16).view(np.uint16)].tobytes()


def mulaw_decode(data: bytes) -> np.ndarray:
    """G.711 mu-law bytes -> int16 samples."""
    return _MULAW_DECODE_TABLE[np.frombuffer(data, dtype=np.uint8)]


def read_wav(path: Path | str, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Any audio file soundfile reads (any rate, any channels) -> mono int16 at `rate`."""
    try:
        samples, file_rate = soundfile.read(str(path), dtype="int16", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError) as error:
        raise ValueError(f"{path} is not an audio file this program can read ({error})") from None
    return resample(to_mono(samples), file_rate, rate)


def write_wav(path: Path | str, pcm16: np.ndarray, rate: int) -> None:
    soundfile.write(str(path), pcm16, rate, subtype="PCM_16")


def frames(pcm16: np.ndarray, size: int = FRAME_SAMPLES) -> Iterator[np.ndarray]:
    """Consecutive frames of `size` samples; the last one is padded with silence."""
    for start in range(0, len(pcm16), size):
        frame = pcm16[start : start + size]
        if len(frame) < size:
            frame = np.concatenate([frame, np.zeros(size - len(frame), dtype=np.int16)])
        yield frame


def pink_noise(n: int, dbfs: float, seed: int) -> np.ndarray:
    """[n] float64 samples of pink (1/f power) noise at `dbfs` RMS (full scale 32768): the spectrum of a room
    or a line's hiss more than white noise is. For benchmarks: generated speech ends in digital silence."""
    spectrum = np.fft.rfft(np.random.default_rng(seed).normal(size=n))
    spectrum /= np.sqrt(np.maximum(np.fft.rfftfreq(n, 1.0 / SAMPLE_RATE), 20.0))  # flat below 20 Hz
    noise = np.fft.irfft(spectrum, n)
    return noise * (32768 * 10 ** (dbfs / 20) / float(np.sqrt(np.mean(noise**2))))


def with_noise_floor(pcm16: np.ndarray, dbfs: float, seed: int) -> np.ndarray:
    """`pcm16` [n] int16 with `pink_noise` at `dbfs` RMS under it (clipped to int16)."""
    noisy = pcm16.astype(np.float64) + pink_noise(len(pcm16), dbfs, seed)
    return np.clip(np.round(noisy), -32768, 32767).astype(np.int16)
