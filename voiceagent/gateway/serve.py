"""`voiceagent serve`: load and warm the pipeline once, then run the gateway under uvicorn until stopped."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable, Sequence

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute
from uvicorn.protocols.http.h11_impl import H11Protocol

from voiceagent.config import Settings
from voiceagent.gateway import webrtc
from voiceagent.gateway.app import build_app

Log = Callable[[str], None]


class RedactTokens(logging.Filter):
    """Masks `token=...` in log records: uvicorn logs each request's path with its query at INFO
    ('"WebSocket /ws?token=KEY" [accepted]'), and browsers send the API key there."""

    _TOKEN = re.compile(r"(token=)[^&\s\"']+", re.IGNORECASE)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = self._redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(self._redact(arg) for arg in record.args)
        return True

    def _redact(self, value: object) -> object:
        return self._TOKEN.sub(r"\1***", value) if isinstance(value, str) else value


def redact_tokens_in_logs() -> None:
    """Installs `RedactTokens` on the loggers uvicorn writes request paths to (idempotent)."""
    for name in ("uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())


class HeadersDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 with a deadline for a request's headers: uvicorn has none, so a client that
    sends them a byte at a time, or never ends them (slow-loris), held its connection for ever. One whose
    started headers are not complete `headers_timeout_s` later gets 408 and is closed. (Bodies have their
    own deadline: gateway/body.py; WebSockets their idle timeout.) engine/server/http_deadline.py is the
    same for the engine server: voiceagent imports engine only in its LLM stage."""

    headers_timeout_s = 10.0
    _deadline: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._headers_pending():
            if self._deadline is None:
                self._deadline = self.loop.call_later(self.headers_timeout_s, self._headers_late)
        elif self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _headers_pending(self) -> bool:
        """Part of a request's head has arrived, not all of it (and the connection is still ours)."""
        waiting, _ = self.conn.trailing_data
        return (
            bool(waiting)
            and self.conn.their_state is h11.IDLE
            and self.transport.get_protocol() is self
            and not self.transport.is_closing()
        )

    def _headers_late(self) -> None:
        self._deadline = None
        if self._headers_pending():
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
            )
            self.transport.close()


def uvicorn_config(app: Starlette, settings: Settings, host: str, port: int) -> uvicorn.Config:
    redact_tokens_in_logs()
    # uvicorn drops messages far over the limit itself (close 1009); smaller excesses get an error event.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws_max_size=16 * settings.max_message_bytes,
        http=HeadersDeadline,
        log_level="warning",
        lifespan="off",
    )


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, log: Log) -> None:
        super().__init__(config)
        self.log = log

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.config.host, self.config.port
            self.log(
                f"voiceagent is listening: open http://{host}:{port} (WebSocket API ws://{host}:{port}/ws)"
            )


async def _serve(settings: Settings, host: str, port: int, log: Log, routes: Sequence[BaseRoute]) -> None:
    from voiceagent.pipeline import Pipeline  # heavy: loads models

    pipeline = await asyncio.to_thread(Pipeline.load, settings, log)
    log("warming up the models")
    await pipeline.warm_up()
    app = build_app(pipeline, settings, routes)
    await _Server(uvicorn_config(app, settings, host, port), log).serve()


def serve(settings: Settings, host: str | None, port: int | None, log: Log) -> None:
    """Blocks until the server is stopped (Ctrl-C)."""
    asyncio.run(_serve(settings, host or settings.host, settings.port if port is None else port, log,
                       webrtc.routes()))  # fmt: skip
