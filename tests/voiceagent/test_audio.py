"""Audio conversions: mu-law both ways, resampling keeps a tone, any WAV becomes mono 16 kHz."""

from pathlib import Path

import numpy as np
import pytest

from voiceagent.audio import (
    frames,
    mulaw_decode,
    mulaw_encode,
    read_wav,
    resample,
    with_noise_floor,
    write_wav,
)


def tone(hz: float, rate: int, seconds: float = 0.5, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * 32767 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def dominant_hz(pcm16: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm16.astype(np.float64)))
    return float(np.fft.rfftfreq(len(pcm16), 1 / rate)[spectrum.argmax()])


def test_mulaw_known_codes_and_round_trip() -> None:
    assert mulaw_encode(np.array([0], dtype=np.int16)) == b"\xff"
    assert mulaw_decode(b"\xff")[0] == 0
    assert mulaw_decode(b"\x00")[0] == -32124 and mulaw_decode(b"\x80")[0] == 32124  # the extremes
    x = np.linspace(-32000, 32000, 2001).astype(np.int16)
    back = mulaw_decode(mulaw_encode(x))
    assert np.all(np.abs(back.astype(int) - x) <= np.maximum(np.abs(x.astype(int)) * 0.07, 8))
    every_code = bytes(c for c in range(256) if c != 0x7F)  # 0x7F is "negative zero", encoded back as 0xFF
    assert mulaw_encode(mulaw_decode(every_code)) == every_code  # decoding then encoding is lossless


@pytest.mark.parametrize(
    ("from_rate", "to_rate"), [(8000, 16000), (16000, 8000), (48000, 16000), (22050, 16000), (16000, 24000)]
)
def test_resampling_keeps_the_tone_and_the_duration(from_rate: int, to_rate: int) -> None:
    out = resample(tone(440, from_rate), from_rate, to_rate)
    assert abs(len(out) - to_rate // 2) <= 2
    assert abs(dominant_hz(out, to_rate) - 440) < 5


def test_any_wav_becomes_mono_16k(tmp_path: Path) -> None:
    stereo = np.stack([tone(300, 48000), tone(300, 48000)], axis=1)
    write_wav(tmp_path / "stereo.wav", stereo, 48000)
    mono = read_wav(tmp_path / "stereo.wav")
    assert mono.ndim == 1 and abs(len(mono) - 8000) <= 2 and abs(dominant_hz(mono, 16000) - 300) < 5


def test_not_audio_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.wav"
    bogus.write_text("this is text")
    with pytest.raises(ValueError, match="is not an audio file"):
        read_wav(bogus)


def test_frames_are_20_ms_and_padded() -> None:
    chunks = list(frames(np.ones(700, dtype=np.int16)))
    assert [len(c) for c in chunks] == [320, 320, 320] and chunks[-1][60:].sum() == 0


def test_a_noise_floor_goes_under_the_audio_at_its_level() -> None:
    speech = np.zeros(16000, dtype=np.int16)
    speech[:8000] = 10000
    noisy = with_noise_floor(speech, -50.0, seed=7)
    assert noisy.dtype == np.int16 and noisy.shape == speech.shape
    floor = noisy[8000:].astype(np.float64)
    assert abs(20 * np.log10(np.sqrt(np.mean(floor**2)) / 32768) + 50.0) < 1.0
    assert np.mean(np.abs(noisy[:8000].astype(np.int32) - 10000)) < 150  # the speech stays (noise ~104 RMS)
    assert np.array_equal(noisy, with_noise_floor(speech, -50.0, seed=7))  # seeded: the same every run
