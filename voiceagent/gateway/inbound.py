"""The user's audio from a socket, at any rate and chunk size, as the session's 20 ms frames.

One streaming filter per connection resamples to 16 kHz, so chunk edges leave no clicks; whatever does not
fill a frame waits for the next chunk. Phone audio (8 kHz) goes through a short FIR of our own (2x, ~2 ms
delay): soxr's streaming filter hands 8 kHz input back in bursts every 100 ms (nothing for four 20 ms chunks,
then five frames), which would hold the caller's audio, and so the end of their speech, back by up to 100
ms. Other rates use soxr (its bursts at 48 kHz are 20-40 ms apart). Each frame is stamped with the time it
began on the sender's side, as far as the server can tell: the last frame of a chunk ends when the chunk
arrived. Every transport (/ws, Twilio, WebRTC) hands a chunk and its arrival time to `InboundAudio` and
the frames it returns to `push_frames`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import soxr

from voiceagent.audio import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, mulaw_decode

if TYPE_CHECKING:
    from voiceagent.session import Session

# Rates a client may send (and receive the agent's audio at).
SUPPORTED_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
_FRAME_NS = FRAME_MS * 1_000_000


class Upsampler2x:
    """8 kHz -> 16 kHz in a stream, with no block buffering: every input sample gives two output samples at
    once. Zero-stuffing, then a Kaiser-windowed sinc low-pass at 4 kHz (63 taps, ~-80 dB stopband) whose
    history carries across chunks; the delay is 31 samples at 16 kHz (~2 ms)."""

    TAPS = 63

    def __init__(self) -> None:
        n = np.arange(self.TAPS) - (self.TAPS - 1) / 2
        taps = np.sinc(n / 2) * np.kaiser(self.TAPS, 8.0)
        self._taps = 2 * taps / taps.sum()  # float64 (numpy convolves it faster); gain 2: the zeros stuffed
        self._history = np.zeros(self.TAPS - 1)

    def __call__(self, samples: np.ndarray) -> np.ndarray:
        stuffed = np.zeros(2 * len(samples))
        stuffed[::2] = samples
        signal = np.concatenate([self._history, stuffed])
        self._history = signal[len(signal) - (self.TAPS - 1) :]
        out = np.convolve(signal, self._taps, mode="valid")
        return np.clip(np.rint(out), -32768, 32767).astype(np.int16)


@dataclass(frozen=True, eq=False)
class InboundFrame:
    samples: np.ndarray  # [320] int16, 16 kHz mono
    start_ns: int  # when it began on the sender's side (clock time)


class InboundAudio:
    """PCM16 mono at `rate` in (bytes or samples, with the clock time they arrived), timestamped [320]
    int16 16 kHz frames out."""

    def __init__(self, rate: int) -> None:
        if rate not in SUPPORTED_RATES:
            raise ValueError(f"sample_rate must be one of {', '.join(map(str, SUPPORTED_RATES))}, got {rate}")
        self.rate = rate
        self._resample: Callable[[np.ndarray], np.ndarray] | None = None
        if rate == SAMPLE_RATE // 2:
            self._resample = Upsampler2x()
        elif rate != SAMPLE_RATE:
            self._resample = soxr.ResampleStream(
                rate, SAMPLE_RATE, 1, dtype="int16", quality="HQ"
            ).resample_chunk
        self._pending = np.zeros(0, dtype=np.int16)
        self.samples_in = 0  # at the input rate

    def push_pcm16(self, data: bytes, arrived_ns: int) -> list[InboundFrame]:
        """Little-endian PCM16 mono bytes -> the frames they complete."""
        if len(data) % 2:
            raise ValueError(f"PCM16 audio comes in whole 2-byte samples, got {len(data)} bytes")
        return self.push(np.frombuffer(data, dtype="<i2").astype(np.int16), arrived_ns)

    def push_mulaw(self, data: bytes, arrived_ns: int) -> list[InboundFrame]:
        """G.711 mu-law bytes -> the frames they complete."""
        return self.push(mulaw_decode(data), arrived_ns)

    def push(self, samples: np.ndarray, arrived_ns: int) -> list[InboundFrame]:
        """[n] int16 samples at `rate`, arrived at `arrived_ns` -> the frames they complete."""
        self.samples_in += len(samples)
        if self._resample is not None:
            samples = self._resample(samples)
        pending = np.concatenate([self._pending, samples])
        n = len(pending) // FRAME_SAMPLES
        self._pending = pending[n * FRAME_SAMPLES :]
        frames = [pending[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(n)]
        return [InboundFrame(f, t_ns) for f, t_ns in zip(frames, frame_starts(arrived_ns, n), strict=True)]


async def push_frames(session: Session, frames: Iterable[InboundFrame]) -> None:
    """The user's frames to the session, each with the time it began."""
    for frame in frames:
        await session.push_audio(frame.samples, frame.start_ns)


def frame_starts(arrived_ns: int, n_frames: int) -> list[int]:
    """Start times of `n_frames` consecutive frames whose last one ended at `arrived_ns`."""
    return [arrived_ns - (n_frames - i) * _FRAME_NS for i in range(n_frames)]
