"""WebRTC signalling and a whole turn over a real peer connection (aiortc on both ends, loopback), with
the session's stages faked; plus every refusal of the offer endpoint."""

from __future__ import annotations

import asyncio
import fractions
import json
from typing import Any

import av
import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from starlette.applications import Starlette

from tests.fakes import FakePipeline
from voiceagent.config import Settings
from voiceagent.gateway import webrtc_peer
from voiceagent.gateway.app import build_app
from voiceagent.gateway.webrtc import routes


class Microphone(MediaStreamTrack):
    """A browser's microphone as aiortc sends it: 0.2 s quiet, 0.6 s of a loud tone, then quiet until
    `speak` makes it loud again."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self.started: float | None = None
        self.loud_until = 0.8

    def speak(self, seconds: float) -> None:
        self.loud_until = self.sent / 48000 + seconds

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        self.started = self.started or loop.time()
        await asyncio.sleep(max(0.0, self.started + self.sent / 48000 - loop.time()))
        t = self.sent / 48000
        loud = 0.2 <= t < self.loud_until
        samples = (8000 * np.sin(2 * np.pi * 300 * (self.sent + np.arange(960)) / 48000)).astype(np.int16)
        frame = av.AudioFrame.from_ndarray((samples if loud else samples * 0).reshape(1, -1), "s16", "mono")
        frame.sample_rate, frame.pts, frame.time_base = 48000, self.sent, fractions.Fraction(1, 48000)
        self.sent += 960
        return frame


def build(**settings: Any) -> Starlette:
    """The gateway's app on fake stages, with the WebRTC routes mounted as `voiceagent serve` mounts them."""
    return build_app(FakePipeline(), Settings(**settings), routes())


async def shut_down(app: Starlette) -> None:
    """Ends every WebRTC peer; the hub must then hold no session."""
    gateway = getattr(app.state, "webrtc", None)
    if gateway is not None:
        await gateway.close()
        assert not gateway.peers
    assert not app.state.hub.live


async def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000")


async def _offer(pc: RTCPeerConnection) -> dict[str, str]:
    await pc.setLocalDescription(await pc.createOffer())
    return {"type": "offer", "sdp": pc.localDescription.sdp}


async def _heard_audio(track: MediaStreamTrack, loud: list[int]) -> None:
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        loud[0] += int((np.abs(frame.to_ndarray()) > 1000).sum())


class Inbox:
    """The JSON messages from the data channel, with a way to wait for one."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()

    def add(self, raw: str) -> None:
        self.messages.append(json.loads(raw))
        self._arrived.set()

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.messages]

    async def wait_for(self, kind: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        """The first message of type `kind` whose fields have the values given."""
        async with asyncio.timeout(timeout_s):
            while True:
                for message in self.messages:
                    if message["type"] == kind and all(message.get(k) == v for k, v in fields.items()):
                        return message
                self._arrived.clear()
                await self._arrived.wait()


def test_a_turn_over_webrtc_transcript_blocks_audio_and_metrics() -> None:
    async def scenario() -> None:
        app = build()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        inbox = Inbox()
        loud = [0]
        channel = pc.createDataChannel("events")
        channel.on("message", inbox.add)
        pc.addTrack(Microphone())
        listening: list[asyncio.Task[None]] = []
        pc.on("track", lambda track: listening.append(asyncio.ensure_future(_heard_audio(track, loud))))
        try:
            async with await _client(app) as client:
                response = await client.post("/webrtc/offer", json=await _offer(pc))
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["type"] == "answer" and answer["session_id"]
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
            started = await inbox.wait_for("session.started", 10)
            assert started["transport"] == "webrtc"
            metrics = await inbox.wait_for("turn.metrics", 20)
            kinds = inbox.kinds()
            for kind in ("vad.speech_start", "vad.speech_end", "agent.block", "agent.audio.start"):
                assert kind in kinds
            assert [m["text"] for m in inbox.messages if m["type"] == "transcript.final"] == ["hello there"]
            assert (
                "".join(m["text"] for m in inbox.messages if m["type"] == "agent.block")
                == "Hi, nice to meet you."
            )
            assert metrics["latency_ms"]["voice_to_voice"] > 0 and metrics["acceptance_rate"] == 0.5
            assert kinds.index("agent.audio.end") < kinds.index("turn.metrics")
            assert loud[0] > 48000 * 0.2  # the fake voice's tone came back through Opus
            # Bad input on the channel gets an error event; the session carries on.
            channel.send("not json")
            channel.send(b"\x00\x01")
            channel.send(json.dumps({"type": "session.start", "audio": {"encoding": "pcm16"}}))
            for code in ("bad_json", "bad_message", "already_started"):
                await inbox.wait_for("error", 5, code=code)
            channel.send(json.dumps({"type": "input.text", "text": "and again"}))
            await inbox.wait_for("turn.metrics", 20, turn=2)
        finally:
            await pc.close()
            for task in listening:
                task.cancel()
            await shut_down(app)  # every task ended, the session's slot freed

    asyncio.run(scenario())


def test_speaking_over_the_agent_cuts_its_voice_and_the_history() -> None:
    async def scenario() -> None:
        words = tuple(f" word{i}" for i in range(20))  # 2 s of the fake voice
        pipeline = FakePipeline(blocks=words)
        app = build_app(pipeline, Settings(), routes())
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        inbox, loud, microphone = Inbox(), [0], Microphone()
        pc.createDataChannel("events").on("message", inbox.add)
        pc.addTrack(microphone)
        listening: list[asyncio.Task[None]] = []
        pc.on("track", lambda track: listening.append(asyncio.ensure_future(_heard_audio(track, loud))))
        try:
            async with await _client(app) as client:
                answer = (await client.post("/webrtc/offer", json=await _offer(pc))).json()
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
            await inbox.wait_for("agent.audio.start", 20, turn=1)
            await asyncio.sleep(0.5)
            microphone.speak(0.6)
            interrupted = await inbox.wait_for("interrupted", 10, turn=1)
            ended = await inbox.wait_for("agent.audio.end", 5, turn=1)
            assert ended["interrupted"] is True
            assert (await inbox.wait_for("turn.metrics", 5, turn=1))["outcome"] == "interrupted"
            heard = interrupted["spoken_text"].split()
            assert 1 <= len(heard) < 15, heard  # about half a second of 2 s was played
            assert pipeline.sessions[0].history[2] == {
                "role": "assistant",
                "content": interrupted["spoken_text"],
            }
            await inbox.wait_for("agent.audio.start", 20, turn=2)
            assert loud[0] < 48000 * 1.5  # the rest of turn 1's voice never went out
        finally:
            await pc.close()
            for task in listening:
                task.cancel()
            await shut_down(app)

    asyncio.run(scenario())


class VanishingMicrophone(Microphone):
    """A browser that closed without a goodbye: its microphone sends 0.5 s, then nothing at all."""

    async def recv(self) -> av.AudioFrame:
        if self.sent >= 48000 // 2:
            await asyncio.Event().wait()  # no more RTP; the connection itself stays up
        return await super().recv()


def test_a_browser_that_stops_sending_audio_ends_its_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webrtc_peer, "MEDIA_TIMEOUT_S", 1.0)

    async def scenario() -> None:
        app = build()
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        inbox = Inbox()
        pc.createDataChannel("events").on("message", inbox.add)
        pc.addTrack(VanishingMicrophone())
        try:
            async with await _client(app) as client:
                answer = (await client.post("/webrtc/offer", json=await _offer(pc))).json()
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
            await inbox.wait_for("session.started", 10)
            [peer_task] = app.state.webrtc.peers.values()
            assert len(app.state.hub.live) == 1
            # 0.5 s of audio, then 1 s of nothing: the peer ends long before ICE consent fails (30 s).
            await asyncio.wait_for(peer_task, 10)
            assert not app.state.hub.live  # the session's slot is free
        finally:
            await pc.close()
            await shut_down(app)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "bad_offer"),
        (json.dumps({"type": "answer", "sdp": "v=0"}).encode(), 400, "bad_offer"),
        (
            json.dumps({"type": "offer", "sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"}).encode(),
            400,
            "bad_offer",
        ),
        (json.dumps({"type": "offer", "sdp": "m=audio" + "x" * 70000}).encode(), 413, "message_too_large"),
    ],
)
def test_bad_offers_get_a_reason_not_a_crash(body: bytes, status: int, code: str) -> None:
    async def scenario() -> None:
        app = build()
        async with await _client(app) as client:
            response = await client.post("/webrtc/offer", content=body)
        assert response.status_code == status
        assert response.json()["type"] == "error" and response.json()["code"] == code
        assert response.json()["message"]
        await shut_down(app)

    asyncio.run(scenario())


def test_api_key_origin_and_session_cap_are_enforced() -> None:
    async def scenario() -> None:
        app = build(api_key="sesame", max_sessions=1)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTrack(Microphone())
        pc.createDataChannel("events")
        offer = await _offer(pc)
        async with await _client(app) as client:
            assert (await client.post("/webrtc/offer", json=offer)).status_code == 401
            wrong = await client.post("/webrtc/offer?token=nope", json=offer)
            assert wrong.status_code == 401 and wrong.json()["code"] == "unauthorized"
            foreign = {"Origin": "https://elsewhere.example", "Authorization": "Bearer sesame"}
            assert (await client.post("/webrtc/offer", json=offer, headers=foreign)).status_code == 403
            first = await client.post("/webrtc/offer?token=sesame", json=offer)
            assert first.status_code == 200
            second = await client.post(
                "/webrtc/offer", json=offer, headers={"Authorization": "Bearer sesame"}
            )
            assert second.status_code == 503 and "limit" in second.json()["message"]
        await pc.close()
        await shut_down(app)

    asyncio.run(scenario())
