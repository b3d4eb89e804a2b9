"""The real-voices turn-taking bench's clips: real recordings in order, and where their speech ends."""

from pathlib import Path

import numpy as np
import pytest

from bench.turn_taking.real import LEAD_S, REAL_TURNS, TRAIL_S, build_real_clips, reference_end_s
from voiceagent.audio import SAMPLE_RATE, pink_noise, read_wav


def _tone(seconds: float, amplitude: float = 6000.0) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (amplitude * np.sin(2 * np.pi * 200 * t)).astype(np.int16)


def test_the_end_of_speech_is_where_the_level_falls_to_the_noise_floor() -> None:
    noise = pink_noise(3 * SAMPLE_RATE, -50.0, seed=1)
    speech = np.concatenate([_tone(0.8), _tone(0.3, 300.0), _tone(0.6)])  # a soft stretch inside the words
    audio = noise.copy()
    start = SAMPLE_RATE // 2
    audio[start : start + speech.size] += speech
    assert abs(reference_end_s(audio) - (start + speech.size) / SAMPLE_RATE) <= 0.01


def test_digital_silence_has_no_end_of_speech() -> None:
    with pytest.raises(ValueError, match="digital silence"):
        reference_end_s(np.zeros(SAMPLE_RATE, np.int16))


def test_real_turns_are_the_recordings_in_order_with_their_ends(tmp_path: Path) -> None:
    """Needs the real speech `make setup` fetches (voiceagent/real_speech.py)."""
    from voiceagent.real_speech import load_clips

    sources = {c.name: c for c in load_clips(log=lambda _: None)}
    clips = {c.name: c for c in build_real_clips(tmp_path)}
    assert set(clips) == {t.name for t in REAL_TURNS}
    for turn in REAL_TURNS:
        clip, parts = clips[turn.name], [sources[name].audio for name in turn.sources]
        audio = read_wav(clip.path)
        lead, trail = int(LEAD_S * SAMPLE_RATE), int(TRAIL_S * SAMPLE_RATE)
        assert np.array_equal(audio[lead : audio.size - trail], np.concatenate(parts))
        speech_s = sum(p.size for p in parts) / SAMPLE_RATE
        assert LEAD_S + speech_s - 1.0 < clip.speech_end_s <= LEAD_S + speech_s, turn.name
        assert clip.kind in ("pause", "complete") and "|" not in clip.text
    assert clips["jfk"].speech_end_s == pytest.approx(LEAD_S + 10.18)  # before the applause, read by hand
