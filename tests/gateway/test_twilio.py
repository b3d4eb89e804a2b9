"""Phone calls over Twilio Media Streams on fake stages: a simulated Twilio streams mu-law at real pace."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from tests.fakes import FakePipeline
from tests.gateway.helpers import client, fake_app, quiet, running, tone
from tests.gateway.twilio_sim import RATE, TwilioCaller

LONG_REPLY = tuple(f" word{i}" for i in range(20))  # 20 words: 2 s of the fake voice
WORD_SAMPLES = RATE // 10  # one 100 ms word at 8 kHz


def signed(token: str, url: str, params: dict[str, str]) -> str:
    """X-Twilio-Signature as Twilio's documentation defines it, computed here independently."""
    data = url + "".join(key + params[key] for key in sorted(params))
    return base64.b64encode(hmac.new(token.encode(), data.encode(), hashlib.sha1).digest()).decode()


def test_a_call_hears_the_agent_and_a_barge_in_clears_it() -> None:
    async def scenario() -> None:
        app, pipeline = fake_app(FakePipeline(blocks=LONG_REPLY))
        async with running(app) as host, connect(f"ws://{host}/twilio") as ws:
            caller = TwilioCaller(ws)
            await caller.connect_and_start()
            await caller.say(np.concatenate([tone(0.4, RATE), quiet(0.3, RATE)]))
            await caller.wait(lambda: caller.played_samples(1) >= 5 * WORD_SAMPLES)  # 0.5 s heard
            # media comes in 100 ms chunks, each followed by its mark, marks counting up
            assert caller.events[:4] == ["media", "mark", "media", "mark"]
            assert caller.marks_received[:3] == ["1:800", "1:1600", "1:2400"]
            await caller.say(np.concatenate([tone(0.3, RATE), quiet(0.3, RATE)]))  # talks over the agent
            await caller.wait(lambda: bool(caller.clears))
            heard_samples = caller.played_samples(1)
            session = pipeline.sessions[0]
            await caller.wait(lambda: session.turn == 2 and len(session.history) >= 4)
            heard = session.history[2]  # after the system prompt and the first question
            assert heard["role"] == "assistant"
            words = heard["content"].split()
            assert words == [w.strip() for w in LONG_REPLY[: len(words)]]
            # the history keeps what the marks returned by playback said was played
            assert heard_samples // WORD_SAMPLES - 1 <= len(words) <= heard_samples // WORD_SAMPLES, words
            # The reply was held at the caller's speech_start (nothing more was sent), so by the time its
            # words cut it everything sent had played: the clear had little or nothing left to flush.
            assert len(caller.marks_sent_back) - len(caller.marks_played) <= 2
            assert caller.media_bytes < 20 * WORD_SAMPLES  # the whole reply was not sent
            # the second utterance is answered in turn 2
            await caller.wait(lambda: caller.played_samples(2) > 0)
            await caller.stop()
            assert caller.closed == (1000, "stream ended")

    asyncio.run(scenario())


def test_twiml_connects_the_call_to_the_stream() -> None:
    async def scenario() -> None:
        app, _ = fake_app()
        async with running(app) as host, httpx.AsyncClient(base_url=f"http://{host}") as http:
            answer = await http.post(
                "/twilio/voice", data={"CallSid": "CA1"}, headers={"X-Forwarded-Proto": "https"}
            )
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/xml")
            assert answer.text.endswith(
                f'<Response><Connect><Stream url="wss://{host}/twilio"/></Connect></Response>'
            )

    asyncio.run(scenario())


def test_twilio_signatures_are_checked_when_a_token_is_set() -> None:
    token, public = "twilio-token", "https://agent.example.com"
    params = {"CallSid": "CA1", "From": "+15550100", "To": "+15550199", "Digits": "1 2"}

    async def scenario() -> None:
        app, _ = fake_app(twilio_auth_token=token, public_url=public)
        async with running(app) as host, httpx.AsyncClient(base_url=f"http://{host}") as http:
            good = signed(token, f"{public}/twilio/voice", params)
            answer = await http.post("/twilio/voice", data=params, headers={"X-Twilio-Signature": good})
            assert answer.status_code == 200 and 'url="wss://agent.example.com/twilio"' in answer.text
            for headers in ({}, {"X-Twilio-Signature": good[:-4] + "AAA="}):
                refused = await http.post("/twilio/voice", data=params, headers=headers)
                assert refused.status_code == 403
            tampered = {**params, "To": "+15550000"}
            refused = await http.post("/twilio/voice", data=tampered, headers={"X-Twilio-Signature": good})
            assert refused.status_code == 403
            async with client(host, "/twilio") as unsigned:
                assert await unsigned.closed_with() == (4401, "invalid X-Twilio-Signature")
            stream_signature = signed(token, "wss://agent.example.com/twilio", {})
            async with connect(
                f"ws://{host}/twilio", additional_headers={"X-Twilio-Signature": stream_signature}
            ) as ws:
                caller = TwilioCaller(ws)
                await caller.connect_and_start()
                await caller.stop()
                assert caller.closed == (1000, "stream ended")

    asyncio.run(scenario())


def test_a_server_with_an_api_key_takes_calls_only_with_signatures() -> None:
    async def scenario() -> None:
        app, _ = fake_app(api_key="k")
        async with running(app) as host, httpx.AsyncClient(base_url=f"http://{host}") as http:
            refused = await http.post("/twilio/voice", data={"CallSid": "CA1"})
            assert refused.status_code == 403 and "VOICEAGENT_TWILIO_AUTH_TOKEN" in refused.text
            async with client(host, "/twilio") as c:
                code, reason = await c.closed_with()
                assert code == 4401 and "VOICEAGENT_TWILIO_AUTH_TOKEN" in reason

    asyncio.run(scenario())


MEDIA_FORMAT = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
START = {"event": "start", "streamSid": "MZ1", "start": {"streamSid": "MZ1", "mediaFormat": MEDIA_FORMAT}}
MEDIA = {"event": "media", "streamSid": "MZ1", "media": {"payload": base64.b64encode(b"\xff" * 160).decode()}}


@pytest.mark.parametrize(
    ("messages", "code", "reason"),
    [
        ([MEDIA], 1008, "media before start"),
        ([{"event": "mark", "mark": {"name": "1:800"}}], 1008, "mark before start"),
        (["{not json"], 1007, "a Twilio message must be JSON"),
        ([b"\x00\x01"], 1007, "Twilio messages are JSON text"),
        ([{"streamSid": "MZ1"}], 1007, "a Twilio message is an object with an 'event'"),
        (
            [START, {"event": "media", "media": {"payload": "%%% not base64"}}],
            1007,
            "media payload is not base64",
        ),
        ([START, {"event": "media", "media": {}}], 1007, "media has no payload"),
        ([START, START], 1008, "a second start on one stream"),
        (
            [{**START, "start": {"streamSid": "MZ1", "mediaFormat": {**MEDIA_FORMAT, "sampleRate": 16000}}}],
            4415,
            "mediaFormat must be audio/x-mulaw 8000 Hz mono, got audio/x-mulaw 16000 Hz x1",
        ),  # fmt: skip
        ([{"event": "start", "start": {"mediaFormat": MEDIA_FORMAT}}], 1007, "start has no streamSid"),
        (
            [START, {"event": "media", "media": {"payload": "A" * 200_000}}],
            1009,
            "message over the size limit",
        ),
    ],
)
def test_bad_twilio_messages_close_the_stream_with_a_reason(
    messages: list[Any], code: int, reason: str
) -> None:
    async def scenario() -> None:
        app, _ = fake_app()
        async with running(app) as host:
            async with client(host, "/twilio", max_size=None) as c:
                for message in messages:
                    await c.ws.send(message if isinstance(message, str | bytes) else json.dumps(message))
                assert await c.closed_with() == (code, reason)
            # the server is still up, and a good call still works
            async with connect(f"ws://{host}/twilio") as ws:
                caller = TwilioCaller(ws)
                await caller.connect_and_start()
                await caller.send("dtmf", {"track": "inbound_track", "digit": "5"})
                await caller.send("future_event", {})  # unknown events are skipped, not fatal
                await caller.stop()
                assert caller.closed == (1000, "stream ended")

    asyncio.run(scenario())
