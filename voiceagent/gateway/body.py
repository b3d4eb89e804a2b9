"""HTTP request bodies read with a size cap and a deadline: a body over the cap is refused as soon as it is
known to be (413, from Content-Length when the client sends one), and one that does not arrive in time (a
slow-loris sender) gets 408. Without this, a POST is read whole into memory, however big or slow."""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

BODY_TIMEOUT_S = 10.0  # a webhook or an offer is a few kB: it arrives in milliseconds


class BodyError(Exception):
    """Why a body was not read: the HTTP status to answer and a reason in words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


async def read_body(request: Request, max_bytes: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, at most `max_bytes`, within `timeout_s`; raises BodyError (413, 408, 400)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyError(413, f"the request body is over the {max_bytes}-byte limit")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise BodyError(413, f"the request body is over the {max_bytes}-byte limit")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyError(408, f"the request body did not arrive within {timeout_s:g} s") from None
    except ClientDisconnect:
        raise BodyError(400, "the client left before sending the whole body") from None
    return b"".join(chunks)
