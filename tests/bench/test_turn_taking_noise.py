"""The turn-taking bench's noisy clips: the same speech over a pink noise floor at the asked level."""

from pathlib import Path

import numpy as np

from bench.turn_taking.clips import Clip, with_noise
from voiceagent.audio import SAMPLE_RATE, pink_noise, read_wav, write_wav


def _level_dbfs(samples: np.ndarray) -> float:
    return float(20 * np.log10(np.sqrt(np.mean(samples.astype(np.float64) ** 2)) / 32768))


def test_pink_noise_has_its_level_and_more_power_low_than_high() -> None:
    noise = pink_noise(SAMPLE_RATE * 2, -50.0, seed=3)
    assert abs(_level_dbfs(noise) + 50.0) < 0.01
    power = np.abs(np.fft.rfft(noise)) ** 2
    freqs = np.fft.rfftfreq(noise.size, 1.0 / SAMPLE_RATE)
    low, high = power[(freqs > 100) & (freqs < 200)].mean(), power[(freqs > 4000) & (freqs < 4100)].mean()
    assert 20 < low / high < 80  # 1/f: ~40x over 100-200 Hz against 4.0-4.1 kHz


def test_noisy_clips_keep_the_speech_and_its_reference_end(tmp_path: Path) -> None:
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    tone = (8000 * np.sin(2 * np.pi * 220 * t)).astype(np.int16)
    audio = np.concatenate([np.zeros(SAMPLE_RATE // 2, np.int16), tone, np.zeros(SAMPLE_RATE, np.int16)])
    write_wav(tmp_path / "c.wav", audio, SAMPLE_RATE)
    path = str(tmp_path / "c.wav")
    clip = Clip("complete-tune-00-piper", "complete", "tune", "piper", "Hi.", (), 1.5, path)
    (noisy,) = with_noise([clip], -50.0, tmp_path)
    assert noisy.path != clip.path and (noisy.speech_end_s, noisy.text, noisy.name) == (1.5, "Hi.", clip.name)
    heard = read_wav(noisy.path)
    assert heard.shape == audio.shape
    assert abs(_level_dbfs(heard[-SAMPLE_RATE:]) + 50.0) < 1.0  # the silence after the speech: the floor
    assert np.corrcoef(heard[8000:24000], tone)[0, 1] > 0.99  # the speech itself is untouched
    again = with_noise([clip], -50.0, tmp_path)[0]  # written once, the same noise
    assert np.array_equal(read_wav(again.path), heard)
