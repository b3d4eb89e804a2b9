"""The gateway's Starlette app: every transport and page of `voiceagent serve`, on one shared `SessionHub`.

    GET  /            the browser demo (static files from web/, or VOICEAGENT_WEB_DIR)
    GET  /healthz     {"status": "ok", "sessions": N, "max_sessions": M}
    GET  /metrics     Prometheus text (gateway/metrics.py)
    WS   /ws          the WebSocket API (gateway/ws.py, docs/protocol.md)
    POST /twilio/voice, WS /twilio   phone calls over Twilio Media Streams (gateway/twilio.py)

`extra_routes` are mounted before the static files (the WebRTC signalling goes there). Their handlers
reach the shared state as `request.app.state.hub` (a `SessionHub`: `.settings`, `.metrics`, `.clock`,
`.open(transport, options)`) and check clients with `security.check_client(request, hub.settings)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from voiceagent.clock import Clock, MonotonicClock
from voiceagent.config import Settings
from voiceagent.gateway.hub import PipelineLike, SessionHub
from voiceagent.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from voiceagent.gateway.twilio import twilio_stream, twilio_voice
from voiceagent.gateway.ws import ws_endpoint

DEFAULT_WEB_DIR = Path(__file__).resolve().parents[2] / "web"


def build_app(
    pipeline: PipelineLike,
    settings: Settings,
    extra_routes: Sequence[BaseRoute] = (),
    *,
    clock: Clock | None = None,
) -> Starlette:
    """The app serving `pipeline` (loaded and warmed by the caller) under `settings`."""
    web_dir = settings.web_dir or DEFAULT_WEB_DIR
    if not web_dir.is_dir():
        raise ValueError(f"the browser demo's folder {web_dir} does not exist (set VOICEAGENT_WEB_DIR)")
    hub = SessionHub(pipeline, settings, GatewayMetrics(), clock or MonotonicClock())
    routes: list[BaseRoute] = [
        Route("/healthz", _healthz),
        Route("/metrics", _metrics),
        WebSocketRoute("/ws", ws_endpoint),
        Route("/twilio/voice", twilio_voice, methods=["POST"]),
        WebSocketRoute("/twilio", twilio_stream),
        *extra_routes,
        Mount("/", StaticFiles(directory=web_dir, html=True), name="web"),
    ]
    app = Starlette(routes=routes)
    app.state.hub = hub
    return app


async def _healthz(request: Request) -> Response:
    hub: SessionHub = request.app.state.hub
    return JSONResponse(
        {"status": "ok", "sessions": len(hub.live), "max_sessions": hub.settings.max_sessions}
    )


async def _metrics(request: Request) -> Response:
    hub: SessionHub = request.app.state.hub
    return Response(hub.metrics.render(), media_type=CONTENT_TYPE)
