"""The /ws WebSocket API on fake stages, through a real uvicorn server and a `websockets` client."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from tests.fakes import FakePipeline
from tests.gateway.helpers import client, fake_app, quiet, running, tone

LONG_REPLY = tuple(f" word{i}" for i in range(20))  # 20 words: 2 s of the fake voice


async def get(host: str, path: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"http://{host}{path}")


def start(rate: int = 16000) -> dict[str, object]:
    return {"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": rate}}


@pytest.mark.parametrize("rate", [16000, 48000])
def test_a_spoken_turn_comes_back_as_events_and_paced_audio(rate: int) -> None:
    async def scenario() -> None:
        app, _ = fake_app()
        async with running(app) as host, client(host) as c:
            await c.send_json(start(rate))
            started = await c.event("session.started")
            assert started["version"] == 1 and started["audio"] == {"encoding": "pcm16", "sample_rate": rate}
            await c.stream(np.concatenate([tone(0.8, rate), quiet(0.4, rate)]), rate)
            metrics = await c.event("turn.metrics")
            types = c.types()
            for earlier, later in [
                ("vad.speech_start", "transcript.partial"),
                ("transcript.partial", "vad.speech_end"),
                ("vad.speech_end", "transcript.final"),
                ("transcript.final", "agent.block"),
                ("agent.block", "agent.audio.start"),
                ("agent.audio.start", "agent.audio.end"),
                ("agent.audio.end", "turn.metrics"),
            ]:
                assert types.index(earlier) < types.index(later), types
            assert (await c.event("transcript.final"))["text"] == "hello there"
            block = await c.event("agent.block")
            assert (block["text"], block["n_drafted"], block["n_accepted"]) == ("Hi,", 4, 2)
            # 5 words of 100 ms at the client's rate, PCM16, paced: sent over about their own duration
            assert c.audio_bytes() == 5 * rate // 10 * 2
            spread = c.audio[-1][0] - c.audio[0][0]
            assert 0.3 < spread < 0.8, spread
            assert (await c.event("agent.audio.start"))["sample_rate"] == rate
            assert metrics["outcome"] == "done" and metrics["input"] == "speech"
            assert metrics["n_drafted"] == 16 and metrics["n_accepted"] == 8
            latency = metrics["latency_ms"]
            assert latency["voice_to_voice"] is not None and 0 < latency["voice_to_voice"] < 1000, latency
            await c.send_json({"type": "session.end"})
            assert (await c.closed_with())[0] == 1000

    asyncio.run(scenario())


def test_typed_input_is_answered() -> None:
    async def scenario() -> None:
        app, pipeline = fake_app()
        async with running(app) as host, client(host) as c:
            await c.send_json(start())
            await c.event("session.started")
            await c.send_json({"type": "input.text", "text": "What time is it?"})
            assert (await c.event("transcript.final"))["text"] == "What time is it?"
            metrics = await c.event("turn.metrics")
            assert metrics["input"] == "text" and metrics["latency_ms"]["asr_final"] == 0
            assert 0 < metrics["latency_ms"]["voice_to_voice"] < 1000, metrics
            assert pipeline.sessions[0].history[-1] == {
                "role": "assistant",
                "content": "Hi, nice to meet you.",
            }

    asyncio.run(scenario())


def test_barge_in_stops_the_audio_and_keeps_only_what_was_heard() -> None:
    async def scenario() -> None:
        app, pipeline = fake_app(FakePipeline(blocks=LONG_REPLY))
        async with running(app) as host, client(host) as c:
            await c.send_json(start())
            await c.event("session.started")
            await c.stream(np.concatenate([tone(0.4, 16000), quiet(0.3, 16000)]), 16000)
            await c.event("agent.audio.start")
            await asyncio.sleep(0.6)  # the agent has spoken about 0.6 s of its 2 s reply
            # Speech over the reply holds it at once; its words (the fake hears "hello there") cut it.
            await c.stream(np.concatenate([tone(0.2, 16000), quiet(0.4, 16000)]), 16000)
            paused = await c.event("agent.paused")
            interrupted = await c.event("interrupted")
            assert paused["turn"] == 1 and c.events.index(paused) < c.events.index(interrupted)
            end = await c.event("agent.audio.end")
            assert end["interrupted"] is True and end["turn"] == interrupted["turn"] == 1
            heard = interrupted["spoken_text"].split()
            assert 3 <= len(heard) <= 10, heard  # about 0.6-0.8 s of 100 ms words
            assert heard == [w.strip() for w in LONG_REPLY[: len(heard)]]
            assert (await c.event("turn.metrics"))["outcome"] == "interrupted"
            await asyncio.sleep(0.3)
            # nothing more of the interrupted turn (the reply to the words that cut it may follow)
            answer = [e["_t"] for e in c.events if e["type"] == "agent.audio.start" and e["turn"] != 1]
            late = [t for t, _ in c.audio if interrupted["_t"] < t < (answer[0] if answer else float("inf"))]
            assert not late, len(late)
            of_turn_1 = sum(len(chunk) for t, chunk in c.audio if t <= interrupted["_t"])
            assert of_turn_1 < 2 * 16000 * 2 // 2  # well under the whole reply
            history = pipeline.sessions[0].history  # then, maybe, the words that cut it and their answer
            assert history[1:3] == [
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": interrupted["spoken_text"]},
            ]

    asyncio.run(scenario())


def test_bad_input_gets_errors_and_the_session_carries_on() -> None:
    async def scenario() -> None:
        app, _ = fake_app(max_message_bytes=4096)
        async with running(app) as host, client(host) as c, client(host) as bystander:
            await bystander.send_json(start())
            await bystander.event("session.started")

            async def error_for(send: object) -> str:
                before = len(c.events)
                await (c.ws.send(send) if isinstance(send, str | bytes) else c.send_json(send))  # type: ignore[arg-type]
                return str((await c.event("error", after=before))["code"])

            assert await error_for("this is not json") == "bad_json"
            assert await error_for("[1, 2]") == "bad_json"
            assert await error_for({"type": "dance"}) == "unknown_type"
            assert await error_for(b"\x00\x01" * 160) == "not_started"
            assert await error_for({"type": "input.text", "text": "hi"}) == "not_started"
            assert await error_for(start(12345)) == "unsupported_audio"
            assert (
                await error_for({"type": "session.start", "audio": {"encoding": "opus"}})
                == "unsupported_audio"
            )
            assert await error_for({"type": "session.start", "version": 7}) == "unsupported_version"
            await c.send_json(start())
            await c.event("session.started")
            assert await error_for(b"\x00" * 8192) == "message_too_large"
            assert await error_for("x" * 8192) == "message_too_large"
            assert await error_for(b"\x00\x01\x02") == "bad_audio"
            assert await error_for(start()) == "already_started"
            assert await error_for({"type": "input.text", "text": "  "}) == "bad_message"
            assert await error_for({"type": "input.text"}) == "bad_message"
            await c.send_json({"type": "input.text", "text": "still there?"})
            assert (await c.event("transcript.final"))["text"] == "still there?"
            assert c.closed is None and bystander.closed is None
            await bystander.send_json({"type": "input.text", "text": "and you?"})
            await bystander.event("turn.metrics")

    asyncio.run(scenario())


def test_api_key_from_header_or_query() -> None:
    async def scenario() -> None:
        app, _ = fake_app(api_key="s3cret")
        async with running(app) as host:
            for options in ({}, {"additional_headers": {"Authorization": "Bearer wrong"}}):
                async with client(host, **options) as c:
                    assert await c.closed_with() == (4401, "missing or invalid API key")
            async with client(host, "/ws?token=wrong") as c:
                assert (await c.closed_with())[0] == 4401
            for path, options in [
                ("/ws?token=s3cret", {}),
                ("/ws", {"additional_headers": {"Authorization": "Bearer s3cret"}}),
            ]:
                async with client(host, path, **options) as c:
                    await c.send_json(start())
                    await c.event("session.started")

    asyncio.run(scenario())


def test_browser_origins_outside_the_allow_list_are_refused() -> None:
    async def scenario() -> None:
        app, _ = fake_app(allowed_origins="https://app.example.com")
        async with running(app) as host:
            async with client(host, origin="https://evil.example.com") as c:  # type: ignore[arg-type]
                code, reason = await c.closed_with()
                assert code == 4403 and "evil.example.com" in reason
            for origin in ("https://app.example.com", f"http://{host}"):  # listed, or the server's own
                async with client(host, origin=origin) as c:  # type: ignore[arg-type]
                    await c.send_json(start())
                    await c.event("session.started")

    asyncio.run(scenario())


def test_sessions_beyond_the_cap_are_refused_not_queued() -> None:
    async def scenario() -> None:
        app, _ = fake_app(max_sessions=1)
        async with running(app) as host:
            async with client(host) as first:
                await first.send_json(start())
                await first.event("session.started")
                assert (await get(host, "/healthz")).json() == {
                    "status": "ok",
                    "sessions": 1,
                    "max_sessions": 1,
                }
                async with client(host) as second:
                    await second.send_json(start())
                    assert (await second.event("error"))["code"] == "session_limit"
                    assert await second.closed_with() == (1013, "session limit reached")
                await first.send_json({"type": "session.end"})
                await first.closed_with()
            async with client(host) as third:  # the slot is free again
                await third.send_json(start())
                await third.event("session.started")

    asyncio.run(scenario())


def test_idle_clients_are_closed() -> None:
    async def scenario() -> None:
        app, _ = fake_app(idle_timeout_s=0.3)
        async with running(app) as host, client(host) as c:
            began = time.monotonic()
            code, reason = await c.closed_with()
            assert code == 4408 and "0.3 s" in reason
            assert 0.25 < time.monotonic() - began < 3

    asyncio.run(scenario())


def test_a_failing_session_ends_alone() -> None:
    class Broken(FakePipeline):
        def new_session(self, clock: object, trace: object, options: object = None) -> object:
            raise RuntimeError("no models")

    async def scenario() -> None:
        app, _ = fake_app(Broken())
        async with running(app) as host:
            async with client(host) as c:
                await c.send_json(start())
                assert (await c.closed_with())[0] == 1011
            assert (await get(host, "/healthz")).status_code == 200

    asyncio.run(scenario())


def test_metrics_page_and_demo() -> None:
    async def scenario() -> None:
        app, _ = fake_app()
        async with running(app) as host:
            async with client(host) as c:
                await c.send_json(start())
                await c.event("session.started")
                await c.stream(np.concatenate([tone(0.4, 16000), quiet(0.3, 16000)]), 16000)
                await c.event("turn.metrics")
            async with httpx.AsyncClient(base_url=f"http://{host}") as http:
                metrics = (await http.get("/metrics")).text
                page = await http.get("/")
        for line in [
            'voiceagent_sessions_total{transport="ws"} 1.0',
            'voiceagent_turns_total{outcome="done",transport="ws"} 1.0',
            "voiceagent_voice_to_voice_seconds_count 1.0",
            'voiceagent_stage_latency_seconds_count{stage="asr_final"} 1.0',
            "voiceagent_spec_draft_tokens_total 16.0",
            "voiceagent_spec_accepted_tokens_total 8.0",
        ]:
            assert line in metrics, line
        assert page.status_code == 200 and "<html" in page.text.lower()

    asyncio.run(scenario())
