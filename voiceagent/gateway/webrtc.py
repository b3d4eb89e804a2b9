"""WebRTC signalling for the browser demo: `POST /webrtc/offer`, one request, no trickle ICE.

The browser gathers its candidates first, then posts `{"type": "offer", "sdp": ...}`; the answer holds
all of the server's candidates: `{"type": "answer", "sdp": ..., "session_id": ID}`. Audio is Opus both ways
and events travel on the data channel "events" the browser opened (webrtc_peer.py). Refusals are JSON
`{"type": "error", "code", "message"}` with an HTTP status: 401/403 (API key, Origin: the same check as
/ws), 413 (an offer over the message size limit), 400 (not an offer), 503 (the session cap).

No STUN or TURN server is used: the server offers its host addresses, and 127.0.0.1 too, which aioice
leaves out on its own (a browser on the same machine, the tests, reaches the server over loopback).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import aioice.ice
from aiortc import RTCPeerConnection, RTCSessionDescription
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from voiceagent.clock import Clock
from voiceagent.config import Settings
from voiceagent.gateway.body import BodyError, read_body
from voiceagent.gateway.hub import SessionHub, SessionLimitError
from voiceagent.gateway.security import check_client
from voiceagent.gateway.webrtc_peer import WebRtcPeer
from voiceagent.gateway.ws_protocol import error_message

ANSWER_TIMEOUT_S = 15.0
LOOPBACK = "127.0.0.1"
log = logging.getLogger(__name__)


def offer_loopback_candidates() -> None:
    """Makes aioice offer 127.0.0.1 beside the host's other addresses (idempotent). Without it, ICE with a
    browser on the same host never completes where loopback is the only interface."""
    original: Callable[..., list[str]] = aioice.ice.get_host_addresses
    if getattr(original, "offers_loopback", False):
        return

    def with_loopback(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        addresses = original(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
        return addresses + [LOOPBACK] if use_ipv4 and LOOPBACK not in addresses else addresses

    with_loopback.offers_loopback = True  # type: ignore[attr-defined]
    aioice.ice.get_host_addresses = with_loopback


def contain_connect_failures() -> None:
    """Turns a failure inside aiortc's own connect task into a warning in the log (idempotent). aiortc
    starts that task from setRemoteDescription and nobody awaits it: an offer it half accepted (found by
    fuzzing: a mangled fingerprint and mid) made it raise AttributeError, which asyncio logged as 'Task
    exception was never retrieved'. That peer never connects, so it ends as any other that does not."""
    original: Callable[[RTCPeerConnection], Awaitable[None]] = RTCPeerConnection._RTCPeerConnection__connect  # type: ignore[attr-defined]
    if getattr(original, "contained", False):
        return

    async def connect(pc: RTCPeerConnection) -> None:
        try:
            await original(pc)
        except Exception as error:  # noqa: BLE001 - this peer only; the server carries on
            log.warning("a WebRTC connection failed to start: %s: %s", type(error).__name__, error)

    connect.contained = True  # type: ignore[attr-defined]
    RTCPeerConnection._RTCPeerConnection__connect = connect  # type: ignore[attr-defined]


def _refuse(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(error_message(code, message), status_code=status)


def routes() -> list[BaseRoute]:
    """The signalling routes, for `build_app(..., extra_routes=routes())`."""
    return [Route("/webrtc/offer", offer_endpoint, methods=["POST"])]


async def offer_endpoint(request: Request) -> Response:
    """POST /webrtc/offer on the app's shared `SessionHub` (`request.app.state.hub`)."""
    gateway = getattr(request.app.state, "webrtc", None)
    if gateway is None:
        hub: SessionHub = request.app.state.hub
        gateway = request.app.state.webrtc = WebRtcGateway(hub, hub.settings, hub.clock)
    return await gateway.offer(request)


class WebRtcGateway:
    """Answers offers and keeps the live peers, so shutting the server down closes them all."""

    def __init__(self, hub: SessionHub, settings: Settings, clock: Clock) -> None:
        self.hub, self.settings, self.clock = hub, settings, clock
        self.peers: dict[WebRtcPeer, asyncio.Task[None]] = {}
        offer_loopback_candidates()
        contain_connect_failures()

    async def offer(self, request: Request) -> Response:
        refusal = check_client(request, self.settings)
        if refusal is not None:
            code = "unauthorized" if refusal.status == 401 else "forbidden_origin"
            return _refuse(refusal.status, code, refusal.reason)
        try:
            body = await read_body(request, self.settings.max_message_bytes)
        except BodyError as error:
            code = {413: "message_too_large", 408: "timeout"}.get(error.status, "bad_offer")
            return _refuse(error.status, code, error.message)
        offer = _parse_offer(body)
        if isinstance(offer, str):
            return _refuse(400, "bad_offer", offer)
        if self.hub.full:
            self.hub.metrics.sessions_refused.labels("webrtc", "session_limit").inc()
            return _refuse(503, "session_limit", "the server is at its session limit; try again later")
        return await self._answer(offer)

    async def _answer(self, offer: RTCSessionDescription) -> Response:
        peer = WebRtcPeer(self.hub, self.clock, self.settings.max_message_bytes)
        answered: asyncio.Future[RTCSessionDescription] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(peer.run(offer, answered))
        self.peers[peer] = task
        task.add_done_callback(lambda done: self._peer_done(peer, done))
        try:
            answer = await asyncio.wait_for(asyncio.shield(answered), ANSWER_TIMEOUT_S)
        except SessionLimitError as error:
            return _refuse(503, "session_limit", str(error))
        except TimeoutError:
            task.cancel()
            return _refuse(503, "no_answer", f"no answer to the offer within {ANSWER_TIMEOUT_S:.0f} s")
        except Exception as error:  # aiortc's errors for an offer it cannot take (ValueError and others)
            task.cancel()
            return _refuse(400, "bad_offer", f"the offer could not be answered: {error}")
        return JSONResponse({"type": answer.type, "sdp": answer.sdp, "session_id": peer.session_id})

    def _peer_done(self, peer: WebRtcPeer, task: asyncio.Task[None]) -> None:
        self.peers.pop(peer, None)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("WebRTC session %s failed: %s: %s", peer.session_id, type(error).__name__, error)

    async def close(self) -> None:
        """Ends every peer and waits for them (the server's shutdown)."""
        tasks = list(self.peers.values())
        for peer in list(self.peers):
            peer.end()
        await asyncio.gather(*tasks, return_exceptions=True)


def _parse_offer(body: bytes) -> RTCSessionDescription | str:
    """The offer, or what is wrong with the request in words."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):  # not JSON or UTF-8, an integer of over 4300 digits, too deep
        return 'the body must be JSON: {"type": "offer", "sdp": "..."}'
    if not isinstance(message, dict) or message.get("type") != "offer":
        return 'the body must be {"type": "offer", "sdp": "..."}'
    sdp = message.get("sdp")
    if not isinstance(sdp, str) or "m=audio" not in sdp:
        return "the offer's sdp must be a string with an audio section (m=audio)"
    return RTCSessionDescription(sdp=sdp, type="offer")
