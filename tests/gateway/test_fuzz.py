"""Fuzzing: a short round of tests/support/fuzzing/ against the gateway and the engine server (each in its own
process, logs captured) while a healthy session uses them; the parsers under arbitrary input (hypothesis);
and a regression test for each fault the fuzzing found."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from aiortc import RTCPeerConnection
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import connect

from engine.server.app import ServerConfig, ServerThread, _read_body
from engine.server.app import build_app as build_engine_app
from engine.server.http_deadline import HeadersDeadline as EngineHeadersDeadline
from engine.server.protocol import APIError, ChatCompletionRequest, parse_request
from tests.fakes import TINY_VOCAB, tiny_engine
from tests.gateway.helpers import client, fake_app, running
from tests.gateway.test_webrtc import build
from tests.gateway.twilio_sim import TwilioCaller
from tests.support.fuzzing import FuzzTokenizer, Plan, fuzz_round
from tests.support.servers import free_port
from voiceagent.gateway import twilio_protocol as tp
from voiceagent.gateway.body import BodyError, read_body
from voiceagent.gateway.channel import Channel
from voiceagent.gateway.codes import Close
from voiceagent.gateway.serve import HeadersDeadline
from voiceagent.gateway.webrtc import _parse_offer, contain_connect_failures
from voiceagent.gateway.webrtc_peer import WebRtcPeer
from voiceagent.gateway.ws_protocol import ProtocolError, parse_client_message
from voiceagent.replay.stats import percentile

DEEP = "[" * 50_000 + "]" * 50_000  # past Python's recursion limit: RecursionError, not a JSONDecodeError


def test_a_fuzzing_round_crashes_nothing_and_answers_every_bad_message(tmp_path: Path) -> None:
    plan = Plan(messages=2500, seed=7, loris=12)
    result = fuzz_round(plan, tmp_path, baseline_s=3.0, loris_hold_s=22.0, progress=lambda tally: None,
                        engine_settings={"body_timeout_s": "5"})  # fmt: skip
    tally = result.tally
    assert result.alive == {"gateway": True, "engine": True}
    assert result.log_faults == {"gateway": [], "engine": []}
    assert tally.n_mismatches == 0, tally.mismatches
    assert tally.messages >= 2300 and set(tally.sent) >= {"ws", "twilio", "webrtc", "engine"}
    assert tally.answered == tally.bad  # every bad message got its error event, close code or 4xx
    for report in result.loris.values():  # slow senders, of headers or of bodies, get 408
        assert report.opened == 6 and report.answered == ["HTTP/1.1 408 Request Timeout"] * 6, report
    # the healthy session completed its turns, at about its usual latency
    before, during = result.baseline["ws"], result.during["ws"]
    assert before.failed == during.failed == 0 and len(during.server_ms) >= 10
    assert percentile(during.server_ms, 50) <= 3 * percentile(before.server_ms, 50) + 20  # type: ignore[operator]
    assert result.during["engine"].failed == 0 and len(result.during["engine"].client_ms) >= 10


# ----- the parsers under any input ------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
HUGE_INT = '{"type": "session.start", "version": ' + "9" * 5000 + "}"  # past int()'s 4300 digits
texts = (
    st.text(max_size=200) | json_values.map(json.dumps) | st.sampled_from([DEEP, HUGE_INT, "", "{", "NaN"])
)


def ws_message_like(value: Any) -> str:
    """Objects that look like our messages, so the fields behind `type` are reached too."""
    kind = {"type": "session.start", "audio": value} if not isinstance(value, dict) else value
    return json.dumps(kind)


@settings(max_examples=300, deadline=None)
@given(texts | json_values.map(ws_message_like))
def test_the_ws_parser_takes_anything_or_names_the_problem(raw: str) -> None:
    try:
        parse_client_message(raw)
    except ProtocolError as error:
        assert error.code in {"bad_json", "unknown_type", "bad_message", "unsupported_version",
                              "unsupported_audio"} and error.message  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(texts | json_values.map(lambda v: json.dumps({"event": "media", "media": v})))
def test_the_twilio_parser_takes_anything_or_closes_with_a_reason(raw: str) -> None:
    try:
        tp.parse(raw)
    except tp.TwilioProtocolError as error:
        assert error.close_code in {Close.INVALID_DATA, Close.UNSUPPORTED} and error.reason


@settings(max_examples=200, deadline=None)
@given(texts | json_values.map(lambda v: json.dumps({"model": "m", "messages": v})))
def test_the_engine_request_parser_answers_4xx_to_anything_bad(raw: str) -> None:
    try:
        parse_request(raw.encode(), ChatCompletionRequest)
    except APIError as error:
        assert 400 <= error.status < 500 and error.message


# ----- regressions: what the fuzzing found ----------------------------------------------------------


@pytest.mark.parametrize("raw", [DEEP, HUGE_INT], ids=["nested-past-the-recursion-limit", "huge-integer"])
def test_json_python_cannot_parse_is_bad_input_not_a_crash(raw: str) -> None:
    with pytest.raises(ProtocolError) as ws_error:
        parse_client_message(raw)
    assert ws_error.value.code == "bad_json"
    with pytest.raises(tp.TwilioProtocolError) as twilio_error:
        tp.parse(raw)
    assert twilio_error.value.close_code == Close.INVALID_DATA
    assert isinstance(_parse_offer(raw.encode()), str)
    with pytest.raises(APIError) as api_error:
        parse_request(raw.encode(), ChatCompletionRequest)
    assert api_error.value.status == 400


class GoneWebSocket:
    """A Starlette WebSocket whose peer has left: closing it raises WebSocketDisconnect."""

    application_state = None

    async def close(self, code: int, reason: str) -> None:
        raise WebSocketDisconnect(code=1006)


def test_closing_a_channel_whose_peer_has_gone_is_quiet() -> None:
    channel = Channel(GoneWebSocket(), 1.0)  # type: ignore[arg-type]
    asyncio.run(channel.close(Close.NORMAL, "session ended"))
    assert not channel.open


def slow_request(chunks: list[bytes], content_length: int | None = None, stall: bool = False) -> Request:
    """A POST whose body arrives as `chunks`, then (with `stall`) never finishes."""
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        if pending:
            return {"type": "http.request", "body": pending.pop(0), "more_body": stall or bool(pending)}
        await asyncio.Event().wait()  # a slow-loris sender: the rest never comes
        raise AssertionError("unreachable")

    return Request(scope, receive)


def test_request_bodies_have_a_size_cap_and_a_deadline() -> None:
    async def status(request: Request, limit: int = 100, timeout_s: float = 0.2) -> int:
        try:
            await read_body(request, limit, timeout_s)
        except BodyError as error:
            return error.status
        return 200

    async def scenario() -> None:
        assert await status(slow_request([b"x" * 10, b"y" * 10])) == 200
        assert await status(slow_request([], content_length=10**12)) == 413  # refused before reading
        assert await status(slow_request([b"x" * 60, b"y" * 60])) == 413  # no Content-Length: counted
        assert await status(slow_request([b"{"], stall=True)) == 408

    asyncio.run(scenario())


def test_the_engine_server_caps_request_bodies_too() -> None:
    async def status(request: Request) -> int:
        try:
            await _read_body(request, ServerConfig("m", max_body_bytes=100, body_timeout_s=0.2))
        except APIError as error:
            return error.status
        return 200

    async def scenario() -> None:
        assert await status(slow_request([b"{}"])) == 200
        assert await status(slow_request([], content_length=5 * 2**20)) == 413
        assert await status(slow_request([b"x" * 101])) == 413
        assert await status(slow_request([b"{"], stall=True)) == 408

    asyncio.run(scenario())


def test_a_failure_in_aiortcs_connect_task_is_a_warning_not_an_unhandled_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A mangled offer left aiortc's unawaited connect task with an SCTP transport of None."""
    contain_connect_failures()

    async def scenario() -> None:
        pc = RTCPeerConnection()
        pc._RTCPeerConnection__sctp = SimpleNamespace(transport=None)  # type: ignore[attr-defined]
        await pc._RTCPeerConnection__connect()  # type: ignore[attr-defined]

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert "a WebRTC connection failed to start: AttributeError" in caplog.text


async def slow_headers(host: str) -> bytes:
    """Starts a request's headers a byte at a time, never ends them, and returns the answer."""
    address, port = host.split(":")
    reader, writer = await asyncio.open_connection(address, int(port))
    for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: a":
        writer.write(bytes([byte]))
        await asyncio.sleep(0.005)
    answer = await asyncio.wait_for(reader.read(100), 5)
    assert await reader.read() == b""  # and closed
    writer.close()
    return answer


def test_a_request_whose_headers_never_end_gets_408(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow-loris: uvicorn has no deadline for a request's headers; the gateway's and the engine server's
    HTTP protocols have one."""
    monkeypatch.setattr(HeadersDeadline, "headers_timeout_s", 0.5)
    monkeypatch.setattr(EngineHeadersDeadline, "headers_timeout_s", 0.5)

    async def scenario() -> None:
        app, _ = fake_app()
        async with running(app) as host:
            assert (await slow_headers(host)).startswith(b"HTTP/1.1 408 Request Timeout")
            async with client(host) as c:  # WebSockets and whole requests are not affected
                await asyncio.sleep(1.0)
                await c.send_json({"type": "session.start"})
                await c.event("session.started")
        engine = tiny_engine()
        engine.tokenizer = FuzzTokenizer(TINY_VOCAB)  # type: ignore[assignment]
        with ServerThread(build_engine_app(engine, ServerConfig("tiny")), port=free_port()) as server:
            host = server.url.removeprefix("http://")
            assert (await slow_headers(host)).startswith(b"HTTP/1.1 408 Request Timeout")
            async with httpx.AsyncClient() as http:
                assert (await http.get(f"{server.url}/v1/models")).status_code == 200

    asyncio.run(scenario())


def test_twilio_marks_that_are_not_ours_change_nothing() -> None:
    """A mark of thousands of digits made int() raise (close 1011 and a traceback); marks for turns never
    sent, or past what was sent, counted as played audio."""

    async def scenario() -> None:
        app, pipeline = fake_app()
        async with running(app) as host, connect(f"ws://{host}/twilio") as ws:
            caller = TwilioCaller(ws)
            await caller.connect_and_start()
            for name in ("9" * 5000 + ":1", "7:800", "0:99999999999", "x:1"):
                await caller.send("mark", {"name": name})
            await caller.wait(lambda: bool(pipeline.sessions))
            await caller.stop()
            assert caller.closed == (1000, "stream ended")
            assert pipeline.sessions[0].replier.spoken == {}  # nothing counted as played

    asyncio.run(scenario())


def test_a_webrtc_connection_that_fails_to_close_still_ends_its_session_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fuzzing: a mangled offer aiortc answered made RTCPeerConnection.close() raise AttributeError, and
    the peer's task failed with it (an ERROR 'WebRTC session ... failed')."""

    async def scenario() -> None:
        app = build()
        peer = WebRtcPeer(app.state.hub, app.state.hub.clock, 65536)
        real_close = peer.pc.close

        async def broken_close() -> None:
            await real_close()
            raise AttributeError("'NoneType' object has no attribute '_unregister_data_receiver'")

        peer.pc.close = broken_close  # type: ignore[method-assign]
        await peer._shut_down()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert "closing a WebRTC connection failed: AttributeError" in caplog.text
