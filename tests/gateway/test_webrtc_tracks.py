"""The WebRTC audio adapters: browser frames to session frames, and the paced outbound track."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import pytest

from tests.fakes import FakeClock
from voiceagent.gateway.inbound import InboundAudio
from voiceagent.gateway.webrtc_tracks import OutboundAudioTrack, frame_to_mono_pcm16


def _stereo_48k_frames(seconds: float, hz: float = 440.0) -> list[av.AudioFrame]:
    """What aiortc's Opus decoder yields: s16 stereo 48 kHz, [1, 1920] interleaved per 20 ms."""
    t = np.arange(int(seconds * 48000)) / 48000
    tone = (8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)
    stereo = np.stack([tone, tone], axis=1).reshape(-1)
    out = []
    for i in range(0, len(tone), 960):
        frame = av.AudioFrame.from_ndarray(stereo[2 * i : 2 * (i + 960)].reshape(1, -1), "s16", "stereo")
        frame.sample_rate = 48000
        out.append(frame)
    return out


def test_browser_audio_becomes_16k_mono_20ms_frames_with_the_same_tone() -> None:
    inbound = InboundAudio(48000)
    frames = [
        f.samples for frame in _stereo_48k_frames(1.0) for f in inbound.push(frame_to_mono_pcm16(frame), 0)
    ]
    assert all(f.shape == (320,) and f.dtype == np.int16 for f in frames)
    assert 45 <= len(frames) <= 50  # the resampler holds back a few ms
    audio = np.concatenate(frames[5:])
    spectrum = np.abs(np.fft.rfft(audio))
    assert abs(np.argmax(spectrum) * 16000 / len(audio) - 440) < 5
    assert 7000 < np.abs(audio).max() < 8500  # level kept through downmix and resampling


def test_planar_float_frames_are_understood() -> None:
    frame = av.AudioFrame.from_ndarray(np.full((2, 480), 0.5, dtype=np.float32), "fltp", "stereo")
    assert frame_to_mono_pcm16(frame).tolist() == [16384] * 480


def test_outbound_track_paces_frames_and_reports_what_played() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        played: list[tuple[int, int]] = []
        track = OutboundAudioTrack(clock, 16000, lambda turn, n: played.append((turn, n)))
        track.push(1, np.full(800, 100, dtype=np.int16))  # 50 ms
        start = clock.now_ns()
        frames = [await track.recv() for _ in range(4)]
        assert clock.now_ns() - start == 60_000_000  # the first frame at once, then one per 20 ms
        assert [f.samples for f in frames] == [320] * 4
        assert played == [(1, 320), (1, 640), (1, 800)]
        third = frames[2].to_ndarray().reshape(-1)
        assert (third[:160] == 100).all() and (third[160:] == 0).all()
        assert [f.pts for f in frames] == [0, 320, 640, 960]

    asyncio.run(scenario())


def test_flush_drops_queued_audio_at_once() -> None:
    async def scenario() -> None:
        track = OutboundAudioTrack(FakeClock(), 48000, lambda turn, n: None)
        track.push(2, np.full(48000, 100, dtype=np.int16))
        assert (await track.recv()).to_ndarray().any()
        track.flush()
        assert track.queued_samples == 0
        assert not (await track.recv()).to_ndarray().any()

    asyncio.run(scenario())


def test_bad_audio_is_refused_with_a_clear_error() -> None:
    track = OutboundAudioTrack(FakeClock(), 16000, lambda turn, n: None)
    with pytest.raises(ValueError, match="int16"):
        track.push(1, np.zeros(10, dtype=np.float32))
    with pytest.raises(ValueError, match="whole 20 ms"):
        OutboundAudioTrack(FakeClock(), 22050 + 1, lambda turn, n: None)
