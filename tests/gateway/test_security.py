"""Security with VOICEAGENT_API_KEY set: no session without the key in one of its two places, keys and
signatures compared in constant time, and logs that hold no key, no words and no audio.

(tests/gateway/test_ws.py covers the key's two accepted places, Origin and the session cap;
test_twilio.py the Twilio signatures; test_faults.py the session and turn length limits.)"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.server.app import Server, ServerConfig
from tests.gateway.helpers import client, quiet, running, tone
from tests.gateway.test_units import request
from tests.gateway.test_webrtc import build
from tests.support.fuzzing import sample_offer, server_process
from voiceagent.config import Settings
from voiceagent.gateway.security import check_client, twilio_refusal, twilio_signature

KEY = "k3y-0f-th3-s3rv3r"
BASIC = base64.b64encode(f"user:{KEY}".encode()).decode()
# The key anywhere but `Authorization: Bearer KEY` or `?token=KEY`: each must be refused.
MISPLACED: list[tuple[str, dict[str, str]]] = [
    ("", {}),
    (f"?api_key={KEY}", {}),
    (f"?key={KEY}", {}),
    (f"?TOKEN={KEY}", {}),
    ("?token=", {}),
    (f"?token={KEY}x", {}),
    (f"?token={KEY[:-1]}", {}),
    ("", {"X-API-Key": KEY}),
    ("", {"Authorization": KEY}),
    ("", {"Authorization": f"Basic {BASIC}"}),
    ("", {"Authorization": f"Basic {KEY}"}),
    ("", {"Authorization": f"Token {KEY}"}),
    ("", {"Authorization": "Bearer "}),
    ("", {"Authorization": f"Bearer {KEY} extra"}),
    ("", {"Cookie": f"token={KEY}"}),
]


def test_no_websocket_session_without_the_key_in_its_place() -> None:
    async def scenario() -> None:
        app = build(api_key=KEY)
        async with running(app) as host:
            for query, headers in MISPLACED:
                async with client(host, f"/ws{query}", additional_headers=headers) as c:
                    # the key inside session.start is not a key either
                    with contextlib_suppress_closed():
                        await c.send_json({**start(), "token": KEY, "api_key": KEY})
                    assert await c.closed_with() == (4401, "missing or invalid API key"), (query, headers)
                    assert "session.started" not in c.types()
            assert not app.state.hub.pipeline.sessions  # not one session was made
            async with client(host, f"/ws?token={KEY}") as c:  # and the key in its place works
                await c.send_json(start())
                await c.event("session.started")

    asyncio.run(scenario())


def test_no_webrtc_offer_is_answered_without_the_key_in_its_place() -> None:
    async def scenario() -> None:
        app = build(api_key=KEY)
        offer = {"type": "offer", "sdp": await sample_offer()}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
            for query, headers in MISPLACED:
                answer = await http.post(
                    f"/webrtc/offer{query}", json={**offer, "token": KEY}, headers=headers
                )
                assert answer.status_code == 401 and answer.json()["code"] == "unauthorized", (query, headers)
            assert not app.state.hub.pipeline.sessions
            answer = await http.post("/webrtc/offer", json=offer, headers={"Authorization": f"Bearer {KEY}"})
            assert answer.status_code == 200
        await app.state.webrtc.close()

    asyncio.run(scenario())


class Spy:
    """hmac.compare_digest, recorded; `verdict` (if set) overrides what it returns."""

    def __init__(self, real: Callable[[Any, Any], bool], verdict: bool | None = None) -> None:
        self.real, self.verdict, self.calls = real, verdict, []  # type: ignore[var-annotated]

    def __call__(self, a: Any, b: Any) -> bool:
        self.calls.append((a, b))
        return self.real(a, b) if self.verdict is None else self.verdict


def test_keys_and_signatures_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check goes through hmac.compare_digest: when it says no, even the right key is refused."""
    settings = Settings(api_key=KEY, twilio_auth_token="twilio-token")
    engine_server = Server.__new__(Server)
    engine_server.config = ServerConfig("m", api_key=KEY)
    url = "http://agent.local/twilio/voice"
    signed = {"x-twilio-signature": twilio_signature("twilio-token", url, {"A": "1"}), "host": "agent.local"}
    for verdict in (None, False):
        spy = Spy(hmac.compare_digest, verdict)
        monkeypatch.setattr(hmac, "compare_digest", spy)
        gateway_ok = check_client(request({"authorization": f"Bearer {KEY}"}), settings) is None
        engine_ok = _authorized(engine_server, {"authorization": f"Bearer {KEY}"})
        twilio_ok = twilio_refusal(request(signed, path="/twilio/voice"), settings, {"A": "1"}) is None
        assert gateway_ok == engine_ok == twilio_ok == (verdict is None)
        presented = [a for a, _ in spy.calls]
        assert KEY.encode() in presented and signed["x-twilio-signature"] in presented
        assert len(spy.calls) >= 3


def _authorized(server: Server, headers: dict[str, str]) -> bool:
    from engine.server.protocol import APIError

    try:
        server.authorize(request(headers, path="/v1/models"))
    except APIError:
        return False
    return True


def start() -> dict[str, object]:
    return {"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}}


class contextlib_suppress_closed:  # noqa: N801 - reads as the contextlib helper it is
    """Sending to a connection the server has already closed raises; the refusal is what is checked."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: object, traceback: object) -> bool:
        return isinstance(error, ConnectionClosed)


SECRET_TEXT = "purple elephant 4711"


def test_logs_hold_no_key_no_words_and_no_audio(tmp_path: Path) -> None:
    """A gateway logging at INFO (more than `voiceagent serve` does) serves sessions with the key in the
    URL, speech and typed text, and a refused client: its log names none of them and holds no audio."""
    with server_process("gateway", tmp_path, {"api_key": KEY}) as server:
        asyncio.run(_sessions_with_secrets(server.url, server.port))
        log = server.log()
    assert "WebSocket /ws" in log  # the log does record the connections...
    for secret in (KEY, "wrong-key-42", SECRET_TEXT, "hello there", "nice to meet"):
        assert secret not in log, secret  # ...but not the key, the words heard or said
    assert all(len(line) < 400 for line in log.splitlines())  # no audio, however encoded
    assert "\x00" not in log


async def _sessions_with_secrets(host: str, port: int) -> None:
    async with connect(f"ws://{host}/ws?token={KEY}") as ws:
        await ws.send(json.dumps(start()))
        pcm = np.concatenate([tone(0.4, 16000), quiet(0.4, 16000)])
        for offset in range(0, len(pcm), 320):
            await ws.send(pcm[offset : offset + 320].astype("<i2").tobytes())
            await asyncio.sleep(0.02)
        await ws.send(json.dumps({"type": "input.text", "text": SECRET_TEXT}))
        metrics = 0
        async for message in ws:
            if isinstance(message, str) and json.loads(message)["type"] == "turn.metrics":
                metrics += 1
                if metrics == 2:
                    break
        await ws.send(json.dumps({"type": "session.end"}))
    with contextlib_suppress_closed():
        async with connect(f"ws://{host}/ws?token=wrong-key-42") as ws:
            await ws.recv()
    async with httpx.AsyncClient() as http:
        offer = {"type": "offer", "sdp": await sample_offer()}
        await http.post(f"http://{host}/webrtc/offer?token=wrong-key-42", json=offer)
