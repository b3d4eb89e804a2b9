"""Phone audio (8 kHz) reaches the session at once: every 20 ms chunk gives its 20 ms frame straight away
(soxr's streaming filter held 8 kHz input back for up to 100 ms and let it out in bursts of five frames),
and the short FIR that does it resamples as well as soxr's HQ filter."""

from __future__ import annotations

import numpy as np
import soxr

from voiceagent.audio import mulaw_decode, mulaw_encode
from voiceagent.gateway.inbound import InboundAudio, Upsampler2x


def speechlike(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    tones = (
        3000 * np.sin(2 * np.pi * 300 * t)
        + 2000 * np.sin(2 * np.pi * 1200 * t)
        + 1000 * np.sin(2 * np.pi * 3000 * t)
    )
    return tones.astype(np.int16)


def test_every_phone_chunk_gives_its_frame_at_once() -> None:
    inbound = InboundAudio(8000)
    audio = speechlike(1.0, 8000)
    counts = [len(inbound.push_mulaw(mulaw_encode(audio[i : i + 160]), 0)) for i in range(0, len(audio), 160)]
    assert counts == [1] * 50  # one 20 ms frame per 20 ms message, from the first one on
    frame = inbound.push_mulaw(mulaw_encode(audio[:160]), 0)[0].samples
    assert frame.shape == (320,) and frame.dtype == np.int16


def test_the_upsampler_matches_soxr_hq_and_keeps_its_state_across_chunks() -> None:
    signal = speechlike(2.0, 8000)
    upsample = Upsampler2x()
    ours = np.concatenate([upsample(signal[i : i + 160]) for i in range(0, len(signal), 160)]).astype(float)
    reference = soxr.resample(signal.astype(np.float32), 8000, 16000, quality="HQ").astype(float)
    delay = (Upsampler2x.TAPS - 1) // 2
    ours, reference = ours[delay + 1000 : delay + 30000], reference[1000:30000]
    error = np.sqrt(np.mean((ours - reference) ** 2)) / np.sqrt(np.mean(reference**2))
    assert error < 1e-3, error


def test_other_rates_still_resample_with_soxr() -> None:
    inbound = InboundAudio(48000)
    frames = [f.samples for i in range(50) for f in inbound.push(np.zeros(960, dtype=np.int16), 0)]
    assert 45 <= len(frames) <= 50 and all(f.shape == (320,) for f in frames)
    assert len(mulaw_decode(b"\xff" * 160)) == 160
