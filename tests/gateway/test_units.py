"""The gateway's pure parts on a fake clock: playout pacing and clearing, input framing, client checks."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from starlette.requests import Request

from tests.fakes import FakeClock
from voiceagent.config import Settings
from voiceagent.events import Interrupted, SpeechAudio, TurnError
from voiceagent.gateway.inbound import InboundAudio, frame_starts
from voiceagent.gateway.outbound import Outbound
from voiceagent.gateway.playout import OutChunk, Playout
from voiceagent.gateway.security import check_client, public_url


class Recorder:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[tuple[int, OutChunk]] = []  # (clock ns, chunk)
        self.played: list[tuple[int, int, int]] = []  # (clock ns, turn, samples)
        self.done: list[tuple[int, str]] = []

    async def send(self, chunk: OutChunk) -> None:
        self.sent.append((self.clock.now_ns(), chunk))

    async def turn_sent(self, turn: int, outcome: str) -> None:
        self.done.append((turn, outcome))

    def on_played(self, turn: int, samples: int) -> None:
        self.played.append((self.clock.now_ns(), turn, samples))


async def until(condition: object, steps: int = 10_000) -> None:
    for _ in range(steps):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def test_playout_paces_reports_played_audio_and_ends_the_turn() -> None:
    async def scenario() -> None:
        clock = FakeClock(start_ns=0)
        out = Recorder(clock)
        playout = Playout(clock, 16000, out.send, out.turn_sent, lead_ms=100, on_played=out.on_played)
        running = asyncio.create_task(playout.run())
        playout.push(SpeechAudio(0, 1, np.ones(16000, dtype=np.int16), 16000, "one second"))
        playout.end_turn(1, "done")
        await until(lambda: out.done and out.played and out.played[-1][2] == 16000)
        running.cancel()
        assert len(out.sent) == 50 and out.sent[0][1].first_of_turn and not out.sent[1][1].first_of_turn
        for i, (t_ns, chunk) in enumerate(out.sent):  # never more than 100 ms ahead of playback
            assert t_ns >= (i * 20 - 100) * 1_000_000, (i, t_ns)
            assert chunk.end_sample == 320 * (i + 1)
        assert out.done == [(1, "done")]
        assert out.played[-1] == (1_000_000_000, 1, 16000)  # all heard once its second has passed
        assert all(t_ns >= samples * 62_500 for t_ns, _, samples in out.played)  # nothing heard early

    asyncio.run(scenario())


def test_playout_clear_drops_queued_audio() -> None:
    async def scenario() -> None:
        clock = FakeClock(start_ns=0)
        out = Recorder(clock)
        playout = Playout(clock, 8000, out.send, out.turn_sent, chunk_ms=100, lead_ms=200)
        running = asyncio.create_task(playout.run())
        playout.push(SpeechAudio(0, 3, np.ones(8000, dtype=np.int16), 8000, "one second"))
        await until(lambda: len(out.sent) >= 4)
        assert playout.clear() == {3}
        sent = len(out.sent)
        playout.end_turn(3, "done")
        await until(lambda: out.done)
        running.cancel()
        assert len(out.sent) == sent < 10 and playout.sent_samples(3) == 800 * sent

    asyncio.run(scenario())


def test_playout_pause_holds_the_turns_audio_until_resume() -> None:
    """Speech over the reply: nothing more of its audio goes out until it resumes; then all of it does."""

    async def scenario() -> None:
        clock = FakeClock(start_ns=0)
        out = Recorder(clock)
        playout = Playout(clock, 8000, out.send, out.turn_sent, chunk_ms=100, lead_ms=200)
        running = asyncio.create_task(playout.run())
        playout.push(SpeechAudio(0, 2, np.ones(8000, dtype=np.int16), 8000, "one second"))
        await until(lambda: len(out.sent) >= 3)
        playout.pause(2)
        sent = len(out.sent)
        playout.end_turn(2, "done")
        for _ in range(200):
            await asyncio.sleep(0)
        assert len(out.sent) <= sent + 1 and not out.done  # at most the chunk already on its way
        playout.resume(2)
        await until(lambda: out.done)
        running.cancel()
        assert len(out.sent) == 10 and playout.sent_samples(2) == 8000 and out.done == [(2, "done")]

    asyncio.run(scenario())


class CancelsTheRunnerOnCleanup(FakeClock):
    """A clock whose sleep never ends by itself. When the playout cancels it (something new woke the
    playout first), it cancels the task running the playout: exactly while that task awaits its own
    cancelled helper, the moment a cancellation used to be swallowed."""

    def __init__(self) -> None:
        super().__init__(start_ns=0)
        self.runner: asyncio.Task[None] | None = None
        self.cancelled_runner = False

    async def sleep(self, seconds: float) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.runner is not None and not self.cancelled_runner:
                self.cancelled_runner = True
                self.runner.cancel()
            raise


def test_playout_run_ends_when_cancelled_while_it_awaits_its_helpers() -> None:
    async def scenario() -> None:
        clock = CancelsTheRunnerOnCleanup()
        out = Recorder(clock)
        playout = Playout(clock, 16000, out.send, out.turn_sent, lead_ms=100, on_played=out.on_played)
        running = asyncio.create_task(playout.run())
        clock.runner = running
        playout.push(SpeechAudio(0, 1, np.ones(16000, dtype=np.int16), 16000, "one second"))
        await until(lambda: len(out.sent) == 6)  # 120 ms sent; now it sleeps until the lead allows more
        playout.end_turn(1, "done")  # wakes it: it cancels and awaits its sleep, which cancels `running`
        await until(running.done, steps=100)
        assert clock.cancelled_runner and running.cancelled()

    asyncio.run(scenario())


class StubLive:
    """The parts of a LiveSession that `Outbound` uses."""

    def __init__(self) -> None:
        self.session = self
        self.sources: list[str] = []

    def audio_sent(self, source: SpeechAudio) -> None:
        self.sources.append(source.phrase)

    def finish_turn(self, turn: int, outcome: str) -> dict[str, object]:
        return {"turn": turn, "outcome": outcome}


def test_outbound_frames_audio_and_reports_failed_and_interrupted_turns() -> None:
    async def scenario() -> None:
        clock = FakeClock(start_ns=0)
        live, messages, audio, flushed = StubLive(), [], [], []

        class RecordingSink:
            async def send_message(self, message: dict[str, object]) -> None:
                messages.append(message)

            async def send_audio(self, chunk: OutChunk) -> None:
                audio.append(chunk)

            async def flush_audio(self, turn: int) -> None:
                flushed.append(True)

        outbound = Outbound(live, clock, 8000, RecordingSink(), lead_ms=100)  # type: ignore[arg-type]
        running = asyncio.create_task(outbound.playout.run())
        await outbound.dispatch(TurnError(0, 1, "llm", "boom"))
        await until(lambda: len(messages) == 2)
        assert messages == [
            {"type": "error", "code": "turn_failed", "message": "boom", "stage": "llm", "turn": 1},
            {"type": "turn.metrics", "turn": 1, "outcome": "error"},
        ]
        messages.clear()
        await outbound.dispatch(SpeechAudio(0, 2, np.ones(8000, dtype=np.int16), 8000, "one second"))
        await until(lambda: len(audio) >= 3)
        await outbound.dispatch(Interrupted(0, 2, "one"))
        running.cancel()
        sent = outbound.playout.sent_samples(2)
        assert flushed == [True] and live.sources == ["one second"] and sent == 160 * len(audio)
        assert messages == [
            {"type": "agent.audio.start", "turn": 2, "sample_rate": 8000},
            {"type": "agent.audio.end", "turn": 2, "samples": sent, "interrupted": True},
            {"type": "interrupted", "turn": 2, "spoken_text": "one"},
            {"type": "turn.metrics", "turn": 2, "outcome": "interrupted"},
        ]

    asyncio.run(scenario())


def test_inbound_audio_frames_any_rate() -> None:
    inbound = InboundAudio(48000)
    frames = [f.samples for f in inbound.push_pcm16(np.ones(48000, dtype="<i2").tobytes(), 0)]  # 1 s
    frames += [f.samples for f in inbound.push(np.zeros(4800, dtype=np.int16), 0)]  # 100 ms more flush it
    assert 50 <= len(frames) <= 55 and all(f.shape == (320,) and f.dtype == np.int16 for f in frames)
    with pytest.raises(ValueError, match="whole 2-byte samples"):
        inbound.push_pcm16(b"\x00\x01\x02", 0)
    with pytest.raises(ValueError, match="sample_rate must be one of"):
        InboundAudio(12345)
    assert frame_starts(1_000_000_000, 2) == [960_000_000, 980_000_000]


def test_inbound_frames_are_stamped_back_from_their_chunks_arrival() -> None:
    inbound = InboundAudio(16000)
    frames = inbound.push_pcm16(np.ones(800, dtype="<i2").tobytes(), 1_000_000_000)  # 2.5 frames
    assert [f.start_ns for f in frames] == frame_starts(1_000_000_000, 2)
    later = inbound.push_pcm16(np.ones(160, dtype="<i2").tobytes(), 1_010_000_000)  # completes the third
    assert [f.start_ns for f in later] == [990_000_000]


def request(headers: dict[str, str], query: str = "", path: str = "/ws") -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "server": ("127.0.0.1", 8000),
    }
    return Request(scope)


def test_client_checks() -> None:
    open_server, keyed = Settings(), Settings(api_key="k", allowed_origins="https://app.example.com/")
    host = {"host": "agent.local:8000"}
    assert check_client(request(host), open_server) is None  # no Origin: not a browser page
    assert check_client(request({**host, "origin": "http://agent.local:8000"}), open_server) is None
    refused = check_client(request({**host, "origin": "https://evil.example"}), open_server)
    assert refused is not None and refused.close_code == 4403 and refused.status == 403
    assert check_client(request({**host, "origin": "https://app.example.com"}, "token=k"), keyed) is None
    assert check_client(request({**host, "authorization": "Bearer k"}), keyed) is None
    for headers, query in [({}, ""), ({"authorization": "Bearer x"}, ""), ({}, "token=x")]:
        refused = check_client(request({**host, **headers}, query), keyed)
        assert refused is not None and refused.close_code == 4401 and refused.status == 401
    everyone = Settings(allowed_origins="*")
    assert check_client(request({**host, "origin": "https://anywhere.example"}), everyone) is None


def test_public_url_follows_the_proxy_or_the_setting() -> None:
    behind_tls = request({"host": "agent.example.com", "x-forwarded-proto": "https"}, "a=1", "/twilio/voice")
    assert public_url(behind_tls, Settings()) == "https://agent.example.com/twilio/voice?a=1"
    configured = Settings(public_url="https://calls.example.com/")
    assert public_url(request({"host": "10.0.0.5:8000"}, path="/twilio/voice"), configured) == (
        "https://calls.example.com/twilio/voice"
    )
