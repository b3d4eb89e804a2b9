"""WebSocket close codes of the gateway (RFC 6455 where one fits, 4xxx application codes otherwise).

Every close carries a reason a person can read; docs/protocol.md lists the codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Close(IntEnum):
    NORMAL = 1000  # session.end, Twilio's stop
    GOING_AWAY = 1001  # the server shuts down
    INVALID_DATA = 1007  # a Twilio message that is not JSON, or media that is not base64
    POLICY = 1008  # a message out of order (Twilio media before start)
    TOO_BIG = 1009  # a message over the size limit (Twilio); /ws answers an error event instead
    INTERNAL = 1011  # a bug: the session ends, the server and other sessions carry on
    TRY_AGAIN_LATER = 1013  # the session cap is reached
    UNAUTHORIZED = 4401  # VOICEAGENT_API_KEY set, no or wrong key / bad Twilio signature
    FORBIDDEN_ORIGIN = 4403  # a browser Origin not in VOICEAGENT_ALLOWED_ORIGINS
    IDLE = 4408  # nothing from the client for VOICEAGENT_IDLE_TIMEOUT_S (and the agent was not replying)
    TOO_LONG = 4410  # the session reached VOICEAGENT_MAX_SESSION_S
    UNSUPPORTED = 4415  # an audio format the transport cannot take (Twilio mediaFormat)


@dataclass(frozen=True)
class Refusal:
    """Why a connection is refused: the WebSocket close code, the HTTP status for plain requests, a reason."""

    close_code: Close
    status: int
    reason: str
