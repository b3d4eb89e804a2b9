"""The event-loop side of a request: committed blocks from the worker thread, as SSE chunks or one body."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

from engine.generate import CommittedBlock
from engine.metrics import GenerationStats
from engine.server.protocol import (
    APIError,
    chat_chunk,
    chat_completion_body,
    completion_body,
    completion_chunk,
    sse,
    usage_body,
    usage_chunk,
)
from engine.server.worker import JobEvent, JobFailed

# The engine's finish reasons as OpenAI's; a cancelled request's client is gone, vLLM calls that "abort".
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort"}


class RequestStream:
    """One request's committed blocks, handed over from the worker thread to the event loop in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._events: asyncio.Queue[JobEvent] = asyncio.Queue()
        self.cancel = threading.Event()

    def deliver(self, event: JobEvent) -> None:
        """Called on the worker thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed: the server is shutting down
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    async def blocks(self) -> AsyncIterator[CommittedBlock]:
        """The blocks up to and including the last one; APIError(500) if the engine failed."""
        while True:
            event = await self._events.get()
            if isinstance(event, JobFailed):
                raise APIError(500, event.message, type="server_error")
            yield event
            if event.finish_reason is not None:
                return


def block_info(block: CommittedBlock) -> dict[str, int]:
    """What one committed block drafted and accepted (sent with each chunk)."""
    return {
        "n_tokens": len(block.token_ids),
        "n_drafted": block.n_drafted,
        "n_accepted": block.n_accepted,
        "position": block.position,
    }


def speculative_summary(stats: GenerationStats) -> dict[str, Any]:
    """The request's speculative-decoding figures (sent with a whole answer)."""
    return {
        "n_blocks": stats.n_blocks,
        "n_drafts": stats.n_drafts,
        "n_draft_tokens": stats.n_draft_tokens,
        "n_accepted_tokens": stats.n_accepted,
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_len": stats.mean_accepted_len,
        "accepted_per_position": list(stats.accepted_per_position),
        "ttft_s": stats.ttft_s,
        "tokens_per_s": stats.tokens_per_s,
    }


def _usage(stats: GenerationStats) -> dict[str, Any]:
    return usage_body(stats.n_prompt_tokens, stats.n_generated, stats.n_cached_prompt_tokens)


def _finish(block: CommittedBlock) -> str | None:
    return (
        None if block.finish_reason is None else FINISH_REASONS.get(block.finish_reason, block.finish_reason)
    )


async def chat_events(
    stream: RequestStream, request_id: str, created: int, model: str, include_usage: bool
) -> AsyncIterator[str]:
    """SSE chunks of a chat completion: one per committed block, then usage (if asked) and [DONE]."""
    first, stats = True, None
    try:
        async for block in stream.blocks():
            # The first chunk names the role, as OpenAI's does; it already carries the first block's text.
            delta = {"role": "assistant", "content": block.text} if first else {"content": block.text}
            first = False
            yield sse(chat_chunk(request_id, created, model, delta, _finish(block), block_info(block)))
            stats = block.stats or stats
    except APIError as error:
        yield sse(error.body())
    if include_usage and stats is not None:
        yield sse(usage_chunk(request_id, created, model, "chat.completion.chunk", _usage(stats)))
    yield sse("[DONE]")


async def completion_events(
    stream: RequestStream, request_id: str, created: int, model: str, include_usage: bool
) -> AsyncIterator[str]:
    """SSE chunks of a text completion: one per committed block, then usage (if asked) and [DONE]."""
    stats = None
    try:
        async for block in stream.blocks():
            yield sse(
                completion_chunk(request_id, created, model, block.text, _finish(block), block_info(block))
            )
            stats = block.stats or stats
    except APIError as error:
        yield sse(error.body())
    if include_usage and stats is not None:
        yield sse(usage_chunk(request_id, created, model, "text_completion", _usage(stats)))
    yield sse("[DONE]")


async def collect(
    stream: RequestStream, request_id: str, created: int, model: str, chat: bool
) -> dict[str, Any]:
    """The whole answer as one response body (non-streaming requests)."""
    text, last = "", None
    async for block in stream.blocks():
        text += block.text
        last = block
    assert last is not None and last.stats is not None, "the engine's last block carries the stats"
    body = chat_completion_body if chat else completion_body
    finish = _finish(last) or "stop"
    return body(request_id, created, model, text, finish, _usage(last.stats), speculative_summary(last.stats))
