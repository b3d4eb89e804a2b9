"""Endpointing on the real Silero model and real (espeak-ng) speech: edges where the speech is, none for
silence, tone or noise, a configurable end-of-speech wait, and an echo guard that ignores quiet speech."""

import numpy as np
import pytest

from tests.fakes import espeak_speech, silence, voiced_bounds
from voiceagent.audio import FRAME_SAMPLES, frames
from voiceagent.vad import Endpointer, VadEdge, VadOptions, load_silero

FRAME_NS = 20_000_000
SENTENCES = [
    "Please book a table for four people at the Italian restaurant on Friday evening.",
    "Remind me to call my sister after lunch on Sunday.",
]


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    directory = tmp_path_factory.mktemp("speech")
    return [espeak_speech(text, directory) for text in SENTENCES]


def run(audio: np.ndarray, endpointer: Endpointer | None = None, t0_ns: int = 0) -> list[VadEdge]:
    endpointer = endpointer or Endpointer()
    return [e for i, f in enumerate(frames(audio)) for e in endpointer.push(f, t0_ns + i * FRAME_NS)]


def test_finds_the_start_and_the_end_of_each_sentence(speech: list[np.ndarray]) -> None:
    for clip in speech:
        audio = np.concatenate([silence(1.0), clip, silence(1.0)])
        start_s, end_s = voiced_bounds(audio)
        edges = run(audio, Endpointer(VadOptions(end_from_quiet=False)))  # the wait from Silero's last voiced
        assert [e.kind for e in edges] == ["speech_start", "speech_end"]
        start, end = edges
        # Silero scores 32 ms chunks: the edges land within a chunk or two of the audible speech.
        assert -0.06 <= start.t_ns / 1e9 - start_s <= 0.1
        assert -0.06 <= end.t_ns / 1e9 - end_s <= 0.12
        assert 0.05 <= (start.confirmed_ns - start.t_ns) / 1e9 <= 0.2  # min_speech_ms plus buffering
        assert 0.28 <= (end.confirmed_ns - end.t_ns) / 1e9 <= 0.34  # the 320 ms end-of-speech wait
        quiet_end = run(audio, Endpointer(VadOptions(end_from_quiet=True)))[-1]  # espeak's words fade out
        assert end.t_ns == quiet_end.t_ns and 0.15 <= (quiet_end.confirmed_ns - end.t_ns) / 1e9 <= 0.34


def test_the_end_of_speech_wait_is_configurable(speech: list[np.ndarray]) -> None:
    audio = np.concatenate([silence(0.5), speech[1], silence(1.5)])
    end = run(audio, Endpointer(VadOptions(end_silence_ms=800)))[-1]
    assert end.kind == "speech_end" and 0.76 <= (end.confirmed_ns - end.t_ns) / 1e9 <= 0.82


def test_two_sentences_with_a_pause_are_two_utterances_and_times_follow_t_ns(
    speech: list[np.ndarray],
) -> None:
    audio = np.concatenate([silence(0.5), speech[0], silence(1.0), speech[1], silence(1.0)])
    edges = run(audio, t0_ns=7_000_000_000)
    assert [e.kind for e in edges] == ["speech_start", "speech_end"] * 2
    second_start = (0.5 + len(speech[0]) / 16000 + 1.0) + voiced_bounds(speech[1])[0]
    assert abs(edges[2].t_ns / 1e9 - 7.0 - second_start) <= 0.1


def test_silence_noise_and_tones_do_not_trigger() -> None:
    rng = np.random.default_rng(0)
    seconds = np.arange(3 * 16000) / 16000
    clips = {
        "silence": silence(3.0),
        "white noise": (rng.standard_normal(3 * 16000) * 3000).astype(np.int16),
        "440 Hz": (16000 * np.sin(2 * np.pi * 440 * seconds)).astype(np.int16),
        "1 kHz": (8000 * np.sin(2 * np.pi * 1000 * seconds)).astype(np.int16),
    }
    for name, audio in clips.items():
        endpointer = Endpointer()
        assert run(audio, endpointer) == [], name
        assert not endpointer.speaking()


def test_the_echo_guard_ignores_quiet_speech_but_not_a_user_talking_over_it(
    speech: list[np.ndarray],
) -> None:
    audio = np.concatenate([silence(0.5), speech[0], silence(1.0)])
    echo = (audio * 0.03).astype(np.int16)  # -30 dB: the agent's own voice coming back down a phone line
    assert [e.kind for e in run(echo)] == ["speech_start", "speech_end"]  # Silero alone cannot tell
    guarded = Endpointer()
    guarded.set_guard(True)
    assert run(echo, guarded) == []
    guarded.reset()
    start = run(audio, guarded)[0]
    assert start.kind == "speech_start"
    assert (start.confirmed_ns - start.t_ns) / 1e6 >= VadOptions().guard_min_speech_ms - 20


def test_speaking_silence_and_reset(speech: list[np.ndarray]) -> None:
    endpointer = Endpointer()
    voiced_end = int(voiced_bounds(speech[1])[1] * 16000)
    audio = np.concatenate([silence(0.5), speech[1][:voiced_end]])
    run(audio, endpointer)
    assert endpointer.speaking() and endpointer.silence_ms() < 100
    run(silence(0.2), endpointer, t0_ns=len(audio) * 62_500)
    assert endpointer.speaking() and 150 <= endpointer.silence_ms() <= 260
    endpointer.reset()
    assert not endpointer.speaking() and endpointer.silence_ms() == 0


def test_the_model_is_loaded_once_and_shared() -> None:
    assert load_silero() is load_silero()
    first, second = Endpointer(), Endpointer()
    run(silence(0.1), first)
    run(silence(0.1), second)
    assert first._model is second._model is load_silero()


@pytest.mark.parametrize(
    "frame",
    [
        np.zeros(FRAME_SAMPLES, dtype=np.float32),
        np.zeros(FRAME_SAMPLES + 1, dtype=np.int16),
        np.zeros((FRAME_SAMPLES, 2), dtype=np.int16),
        bytes(2 * FRAME_SAMPLES),
    ],
)
def test_a_bad_frame_is_a_clear_error(frame: object) -> None:
    with pytest.raises(ValueError, match=r"\[320\] int16"):
        Endpointer().push(frame, 0)  # type: ignore[arg-type]


def test_bad_options_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="threshold"):
        VadOptions(threshold=1.5)
    with pytest.raises(ValueError, match="end_silence_ms"):
        VadOptions(end_silence_ms=-1)
    with pytest.raises(ValueError, match="t_ns"):
        Endpointer().push(silence(0.02), 0.5)  # type: ignore[arg-type]


def test_frames_keep_their_own_time_even_with_gaps(speech: list[np.ndarray]) -> None:
    audio = np.concatenate([silence(0.5), speech[1], silence(1.0)])
    endpointer, edges = Endpointer(), []
    for i, frame in enumerate(frames(audio)):
        jitter = 3_000_000 if i % 2 else 0  # transports stamp frames on arrival
        edges += endpointer.push(frame, i * FRAME_NS + jitter)
    start_s, end_s = voiced_bounds(audio)
    assert abs(edges[0].t_ns / 1e9 - start_s) <= 0.1 and abs(edges[1].t_ns / 1e9 - end_s) <= 0.13


def test_frames_stamped_on_arrival_are_no_silence_while_the_user_speaks(speech: list[np.ndarray]) -> None:
    """A frame 0-3 ms late moves the chunk grid to its own stamp; that is no silence (it read 0.2-1.2 ms,
    and a head start and a regular partial wait for exactly none)."""
    rng = np.random.default_rng(0)
    endpointer, readings = Endpointer(), []
    for i, frame in enumerate(frames(np.concatenate([silence(0.5), voiced(speech[1])]))):
        endpointer.push(frame, i * FRAME_NS + int(rng.integers(0, 3_000_000)))
        if endpointer.speaking():
            readings.append(endpointer.silence_ms())
    assert len(readings) > 50 and readings.count(0.0) > len(readings) / 2
    assert not [ms for ms in readings if 0.0 < ms < 16.0]


def push_until(endpointer: Endpointer, audio: np.ndarray, t0_ns: int = 0) -> tuple[list[VadEdge], int]:
    """Pushes `audio`'s frames; returns the edges and the time just after its last frame."""
    chunks = list(frames(audio))
    edges = [e for i, f in enumerate(chunks) for e in endpointer.push(f, t0_ns + i * FRAME_NS)]
    return edges, t0_ns + len(chunks) * FRAME_NS


def voiced(clip: np.ndarray) -> np.ndarray:
    """`clip` without the silence espeak-ng leaves after the words."""
    return clip[: int(voiced_bounds(clip)[1] * 16000)]


def test_a_shorter_wait_set_during_the_silence_ends_the_turn_sooner(speech: list[np.ndarray]) -> None:
    endpointer = Endpointer()
    _, t = push_until(endpointer, np.concatenate([silence(0.5), voiced(speech[1]), silence(0.1)]))
    assert endpointer.speaking()
    endpointer.set_end_silence_ms(120)
    edges, _ = push_until(endpointer, silence(1.0), t)
    assert [e.kind for e in edges] == ["speech_end"]
    assert 0.1 <= (edges[0].confirmed_ns - edges[0].t_ns) / 1e9 <= 0.16


@pytest.mark.parametrize("silence_s", [0.24, 0.26, 0.28])  # frames that do and do not complete a chunk
def test_a_wait_the_silence_already_passed_ends_it_at_the_next_frame(
    speech: list[np.ndarray], silence_s: float
) -> None:
    """A wait shortened between two of Silero's chunks (a finished sentence's score arriving) ends the speech
    at the very next frame, whether or not that frame completes a chunk."""
    endpointer = Endpointer()
    _, t = push_until(endpointer, np.concatenate([silence(0.5), voiced(speech[1]), silence(silence_s)]))
    assert endpointer.speaking() and endpointer.silence_ms() >= 150
    endpointer.set_end_silence_ms(100)
    edges, _ = push_until(endpointer, silence(0.2), t)
    assert [e.kind for e in edges] == ["speech_end"]
    assert edges[0].confirmed_ns == t  # the first frame pushed after the change
    assert endpointer.last_voiced_ns() == edges[0].t_ns


def test_a_new_utterance_does_not_inherit_the_last_one_s_silence(speech: list[np.ndarray]) -> None:
    """After an end, the next speech_start begins on a voiced chunk: the frames after it, which complete no
    chunk, do not end it on the silence that ended the last one."""
    endpointer = Endpointer(VadOptions(end_silence_ms=100))
    clip = voiced(speech[1])
    edges, _ = push_until(endpointer, np.concatenate([silence(0.5), clip, silence(0.6), clip, silence(0.6)]))
    assert [e.kind for e in edges] == ["speech_start", "speech_end"] * 2
    assert all(b.t_ns - a.t_ns >= 0.5e9 for a, b in zip(edges[::2], edges[1::2], strict=True))


def test_a_longer_wait_keeps_a_paused_sentence_one_utterance(speech: list[np.ndarray]) -> None:
    first, second = speech[1][: len(speech[1]) // 2], speech[1][len(speech[1]) // 2 :]
    audio = np.concatenate([silence(0.5), first, silence(0.9), second, silence(2.0)])
    assert [e.kind for e in run(audio)] == ["speech_start", "speech_end"] * 2  # 320 ms cuts the pause
    endpointer = Endpointer()
    endpointer.set_end_silence_ms(1500)
    endpointer.reset()  # the wait outlives a reset, as the guard does
    assert endpointer.end_silence_ms == 1500
    assert [e.kind for e in run(audio, endpointer)] == ["speech_start", "speech_end"]
    with pytest.raises(ValueError, match="whole number of ms"):
        endpointer.set_end_silence_ms(-5)


def _quiet_lead_ms(endpointer: Endpointer, audio: np.ndarray) -> float:
    """Pushes `audio`; returns how long `quiet_ms` had run when the last silence began (checking on every
    frame that it never lags `silence_ms`)."""
    lead, silent = None, False
    for i, frame in enumerate(frames(audio)):
        endpointer.push(frame, i * FRAME_NS)
        silence_ms, quiet_ms = endpointer.silence_ms(), endpointer.quiet_ms()
        assert quiet_ms >= silence_ms
        assert endpointer.last_loud_ns() <= endpointer.last_voiced_ns()  # the words end no later by level
        if silence_ms > 0.0 and not silent:
            lead = quiet_ms - silence_ms
        silent = silence_ms > 0.0
    assert lead is not None, "the silence never began"
    return lead


@pytest.mark.parametrize(("noise_dbfs", "least_lead_ms"), [(None, 0.0), (-60.0, 32.0), (-50.0, 32.0)])
def test_the_quiet_tail_leads_silero_s_silence_at_the_end_of_speech(
    speech: list[np.ndarray], noise_dbfs: float | None, least_lead_ms: float
) -> None:
    """Over a noise floor (any real line: 25-40 dB under the speech) Silero calls the ~30-100 ms after the
    last word voiced; the level says quiet a chunk or more sooner. Over digital silence Silero drops at
    once, and the quiet tail never lags it."""
    rng = np.random.default_rng(0)
    for clip in speech:
        audio = np.concatenate([silence(0.5), clip, silence(0.6)]).astype(np.float64)
        if noise_dbfs is not None:
            audio += rng.normal(0.0, 32768 * 10 ** (noise_dbfs / 20), audio.shape)
        pcm = np.clip(audio, -32768, 32767).astype(np.int16)
        endpointer = Endpointer(VadOptions(end_silence_ms=60_000))
        assert _quiet_lead_ms(endpointer, pcm) >= least_lead_ms
        # where the words end by their level: as far ahead of Silero's last voiced chunk
        assert endpointer.last_voiced_ns() - endpointer.last_loud_ns() >= least_lead_ms * 1_000_000


def test_loud_noise_is_never_quiet(speech: list[np.ndarray]) -> None:
    """Over noise as loud as the speech the level tells nothing: `quiet_ms` is `silence_ms`."""
    rng = np.random.default_rng(1)
    audio = np.concatenate([silence(0.5), voiced(speech[1]), silence(0.6)]).astype(np.float64)
    audio += rng.normal(0.0, 32768 * 10 ** (-26 / 20), audio.shape)
    pcm = np.clip(audio, -32768, 32767).astype(np.int16)
    endpointer = Endpointer(VadOptions(end_silence_ms=60_000))
    for i, frame in enumerate(frames(pcm)):
        endpointer.push(frame, i * FRAME_NS)
        assert endpointer.quiet_ms() == endpointer.silence_ms()


@pytest.mark.parametrize("noise_dbfs", [None, -50.0])
def test_speech_ends_counting_from_the_quiet_tail(speech: list[np.ndarray], noise_dbfs: float | None) -> None:
    """The silence that ends speech counts from the quiet tail's start (`end_from_quiet`): over a noise
    floor a chunk or more sooner than from Silero's last voiced chunk, never later, and never before
    Silero's silence has begun."""
    rng = np.random.default_rng(2)
    sooner = []
    for clip in speech:
        audio = np.concatenate([silence(0.5), clip, silence(0.8)]).astype(np.float64)
        if noise_dbfs is not None:
            audio += rng.normal(0.0, 32768 * 10 ** (noise_dbfs / 20), audio.shape)
        pcm = np.clip(audio, -32768, 32767).astype(np.int16)
        ends = []
        for from_quiet in (True, False):
            endpointer = Endpointer(VadOptions(end_silence_ms=160, end_from_quiet=from_quiet))
            edges = [e for e in run(pcm, endpointer) if e.kind == "speech_end"]
            assert len(edges) == 1
            ends.append(edges[0])
        quiet_end, voiced_end = ends
        assert quiet_end.t_ns == voiced_end.t_ns  # the same last voiced chunk
        assert quiet_end.t_ns < quiet_end.confirmed_ns <= voiced_end.confirmed_ns
        sooner.append((voiced_end.confirmed_ns - quiet_end.confirmed_ns) / 1e6)
    if noise_dbfs is not None:
        assert np.median(sooner) >= 32.0


def test_each_wait_says_where_it_counts_from(speech: list[np.ndarray]) -> None:
    """`set_end_silence_ms(ms, from_quiet=...)` overrides `VadOptions.end_from_quiet` for that wait."""
    rng = np.random.default_rng(3)
    audio = np.concatenate([silence(0.5), speech[1], silence(0.8)]).astype(np.float64)
    audio += rng.normal(0.0, 32768 * 10 ** (-50 / 20), audio.shape)
    pcm = np.clip(audio, -32768, 32767).astype(np.int16)
    ends = {}
    for from_quiet in (True, False):
        endpointer = Endpointer(VadOptions(end_from_quiet=not from_quiet))
        endpointer.set_end_silence_ms(160, from_quiet=from_quiet)
        ends[from_quiet] = run(pcm, endpointer)[-1]
    assert ends[True].t_ns == ends[False].t_ns and ends[True].confirmed_ns < ends[False].confirmed_ns
