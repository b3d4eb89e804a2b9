"""uvicorn's HTTP/1.1 protocol with a deadline for a request's headers, for `python -m engine serve`.

uvicorn has none: a client that sends its headers a byte at a time, or never ends them (slow-loris), holds
its connection for ever. `HeadersDeadline` answers 408 and closes a connection whose started request head
is not complete `headers_timeout_s` later. Request bodies have their own deadline (`ServerConfig.
body_timeout_s`). The gateway has the same protocol (voiceagent/gateway/serve.py): the two packages do not
import each other's servers.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeadersDeadline(H11Protocol):
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
