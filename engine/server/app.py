"""`python -m engine serve`: the engine behind an OpenAI-compatible HTTP API, launched with vLLM's flags.

Endpoints: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (streaming SSE and not),
GET /health, GET /metrics (Prometheus, vLLM's metric names). One engine serves one request at a time at
batch 1; others wait in a bounded first-come-first-served queue (a full queue answers 429). A stream sends
one chunk per committed block, so a client sees every block the moment speculative decoding commits it; a
client that disconnects cancels its generation at the next block.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.generate import Clock, Engine
from engine.server.http_deadline import HeadersDeadline
from engine.server.metrics import CONTENT_TYPE, ServerMetrics
from engine.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, parse_request
from engine.server.stream import RequestStream, chat_events, collect, completion_events
from engine.server.text import TextCodec, sampling_params
from engine.server.worker import EngineWorker, Job, QueueFull


@dataclass(frozen=True)
class ServerConfig:
    """What the server answers as and how it admits requests."""

    model_name: str  # the id clients send as "model" and /v1/models lists
    api_key: str | None = None  # when set, /v1/* needs "Authorization: Bearer <key>"
    max_queue_len: int = 16  # requests that may wait while one is generated; more get 429
    num_speculative_tokens: int | None = None  # per-position metric series created up front (fixed gamma)
    model_root: str = ""  # the checkpoint the model came from (shown in /v1/models)
    max_body_bytes: int = 4 * 2**20  # a request body over this is refused (413) before it is read whole
    body_timeout_s: float = 30.0  # a body that does not arrive within this (a slow-loris sender) gets 408


class Server:
    """The app's state: the engine worker, the tokenizer side, metrics and the config."""

    def __init__(self, engine: Engine, config: ServerConfig, clock: Clock, wall_clock: Clock) -> None:
        self.config, self.clock, self.wall_clock = config, clock, wall_clock
        self.codec = TextCodec(engine.tokenizer, engine.max_seq_len, engine.target.args.vocab_size)
        self.metrics = ServerMetrics(config.model_name, config.num_speculative_tokens)
        self.worker = EngineWorker(engine, self.metrics, max_waiting=config.max_queue_len, clock=clock)
        self.created = int(wall_clock())

    def authorize(self, request: Request) -> None:
        if self.config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.config.api_key.encode()
        ):
            raise APIError(
                401,
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )

    def check_model(self, model: str) -> None:
        if model != self.config.model_name:
            raise APIError(
                404,
                f"The model `{model}` does not exist. This server serves `{self.config.model_name}`.",
                param="model",
                code="model_not_found",
            )

    def submit(
        self, prompt_ids: list[int], request: ChatCompletionRequest | CompletionRequest
    ) -> RequestStream:
        """Queues a generation; raises APIError(429) when the queue is full."""
        params = sampling_params(request, len(prompt_ids), self.codec.max_model_len)
        stream = RequestStream(asyncio.get_running_loop())
        job = Job(prompt_ids, params, stream.deliver, arrived=self.clock(), cancel=stream.cancel)
        try:
            self.worker.submit(job)
        except QueueFull as error:
            raise APIError(429, str(error), type="rate_limit_error", code="queue_full") from None
        return stream


Handler = Callable[[Request, Server], Awaitable[Response]]


def build_app(
    engine: Engine, config: ServerConfig, *, clock: Clock = time.monotonic, wall_clock: Clock = time.time
) -> Starlette:
    """The ASGI app; its worker thread starts and stops with the app's lifespan."""
    server = Server(engine, config, clock, wall_clock)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        server.worker.start()
        try:
            yield
        finally:
            server.worker.stop()

    def route(path: str, handler: Handler, method: str) -> Route:
        async def endpoint(request: Request) -> Response:
            return await handler(request, server)

        return Route(path, endpoint, methods=[method])

    app = Starlette(
        routes=[
            route("/health", _health, "GET"),
            route("/metrics", _metrics, "GET"),
            route("/v1/models", _models, "GET"),
            route("/v1/chat/completions", _chat_completions, "POST"),
            route("/v1/completions", _completions, "POST"),
        ],
        exception_handlers={APIError: _api_error, HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.server = server
    return app


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, APIError)
    headers = {"Retry-After": "1"} if error.status == 429 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    body = APIError(
        error.status_code, f"{request.method} {request.url.path}: {error.detail}", type=kind
    ).body()
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


async def _health(request: Request, server: Server) -> Response:
    if not server.worker.alive:
        return JSONResponse({"status": "engine worker stopped"}, status_code=503)
    return Response(status_code=200)


async def _metrics(request: Request, server: Server) -> Response:
    return Response(server.metrics.render(), media_type=CONTENT_TYPE)


async def _models(request: Request, server: Server) -> Response:
    server.authorize(request)
    model = {
        "id": server.config.model_name,
        "object": "model",
        "created": server.created,
        "owned_by": "voiceagent",
        "root": server.config.model_root or server.config.model_name,
        "parent": None,
        "max_model_len": server.codec.max_model_len,
    }
    return JSONResponse({"object": "list", "data": [model]})


async def _chat_completions(request: Request, server: Server) -> Response:
    server.authorize(request)
    body = parse_request(await _read_body(request, server.config), ChatCompletionRequest)
    server.check_model(body.model)
    prompt_ids = server.codec.chat(body.messages)
    return await _answer(request, server, body, prompt_ids, "chatcmpl")


async def _completions(request: Request, server: Server) -> Response:
    server.authorize(request)
    body = parse_request(await _read_body(request, server.config), CompletionRequest)
    server.check_model(body.model)
    prompt_ids = server.codec.completion(body.prompt)
    return await _answer(request, server, body, prompt_ids, "cmpl")


async def _read_body(request: Request, config: ServerConfig) -> bytes:
    """The body: at most `config.max_body_bytes`, within `config.body_timeout_s` (else APIError 413, 408)."""
    limit = config.max_body_bytes
    too_large = APIError(
        413, f"The request body is over the server's {limit}-byte limit.", code="body_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async with asyncio.timeout(config.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)
    except TimeoutError:
        timeout = config.body_timeout_s
        raise APIError(
            408, f"The request body did not arrive within {timeout:g} s.", code="timeout"
        ) from None
    except ClientDisconnect:
        raise APIError(400, "The client left before sending the whole request body.") from None
    return b"".join(chunks)


async def _answer(
    request: Request,
    server: Server,
    body: ChatCompletionRequest | CompletionRequest,
    prompt_ids: list[int],
    prefix: str,
) -> Response:
    stream = server.submit(prompt_ids, body)
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    created, model = int(server.wall_clock()), server.config.model_name
    if body.stream:
        events = chat_events if isinstance(body, ChatCompletionRequest) else completion_events
        chunks = events(stream, request_id, created, model, body.include_usage)
        return StreamingResponse(
            _until_disconnect(request, stream, chunks),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    async with _cancel_when_gone(request, stream.cancel):
        result = await collect(stream, request_id, created, model, isinstance(body, ChatCompletionRequest))
    return JSONResponse(result)


async def _until_disconnect(
    request: Request, stream: RequestStream, chunks: AsyncIterator[str]
) -> AsyncIterator[str]:
    """Relays `chunks` until they end or the client leaves."""
    async with _cancel_when_gone(request, stream.cancel):
        async for chunk in chunks:
            yield chunk


@contextlib.asynccontextmanager
async def _cancel_when_gone(request: Request, cancel: threading.Event) -> AsyncIterator[None]:
    """Sets `cancel` as soon as the client disconnects, or when the block is left early (an error, a
    cancelled handler); the engine stops at its next block. After a finished answer it changes nothing."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        cancel.set()

    watcher = asyncio.create_task(watch())
    try:
        yield
    finally:
        watcher.cancel()
        cancel.set()


def run(engine: Engine, config: ServerConfig, *, host: str, port: int, log_level: str = "info") -> None:
    """Serves until interrupted (SIGINT/SIGTERM), then cancels the running generation and exits."""
    app = build_app(engine, config)
    uvicorn_config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5, http=HeadersDeadline
    )
    uvicorn.Server(uvicorn_config).run()


class ServerThread:
    """Runs an app on host:port in a background thread of this process (for embedding and tests)."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning"
    ) -> None:
        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=2, http=HeadersDeadline
        )
        self.server = uvicorn.Server(config)
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self.server.run, name="engine-server", daemon=True)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server did not start on {self.url} (is the port free?)")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
