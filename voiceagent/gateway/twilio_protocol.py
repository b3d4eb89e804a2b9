"""Twilio Media Streams messages (bidirectional `<Connect><Stream>`), parsed and built.

In: `connected`, `start` (streamSid, mediaFormat audio/x-mulaw 8000 Hz mono), `media` (base64 mu-law, 20
ms), `mark` (a mark we sent, played), `dtmf`, `stop`. Out: `media`, `mark`, `clear`. A message that is not
what Twilio sends raises `TwilioProtocolError` with the close code it deserves; unknown events parse as
`Unknown` (Twilio adds events over time; they are noted and skipped).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import quoteattr

from voiceagent.gateway.codes import Close

TWILIO_RATE = 8000


class TwilioProtocolError(ValueError):
    def __init__(self, close_code: Close, reason: str) -> None:
        super().__init__(reason)
        self.close_code, self.reason = close_code, reason


@dataclass(frozen=True)
class Connected:
    pass


@dataclass(frozen=True)
class Start:
    stream_sid: str
    call_sid: str
    custom_parameters: dict[str, str]


@dataclass(frozen=True)
class Media:
    payload: bytes  # mu-law bytes
    track: str


@dataclass(frozen=True)
class Mark:
    name: str


@dataclass(frozen=True)
class Dtmf:
    digit: str


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Unknown:
    event: str


TwilioMessage = Connected | Start | Media | Mark | Dtmf | Stop | Unknown


def parse(raw: str) -> TwilioMessage:
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, an integer of over 4300 digits, or nested too deep
        raise TwilioProtocolError(Close.INVALID_DATA, "a Twilio message must be JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("event"), str):
        raise TwilioProtocolError(Close.INVALID_DATA, "a Twilio message is an object with an 'event'")
    event = message["event"]
    body = message.get(event, {})
    if not isinstance(body, dict):
        raise TwilioProtocolError(Close.INVALID_DATA, f"the {event!r} field must be an object")
    if event == "connected":
        return Connected()
    if event == "start":
        return _start(message, body)
    if event == "media":
        return _media(body)
    if event == "mark":
        return Mark(str(body.get("name", "")))
    if event == "dtmf":
        return Dtmf(str(body.get("digit", "")))
    if event == "stop":
        return Stop()
    return Unknown(event[:40])


def _start(message: dict[str, Any], body: dict[str, Any]) -> Start:
    stream_sid = body.get("streamSid", message.get("streamSid"))
    if not isinstance(stream_sid, str) or not stream_sid:
        raise TwilioProtocolError(Close.INVALID_DATA, "start has no streamSid")
    media_format = body.get("mediaFormat", {})
    if not isinstance(media_format, dict):
        raise TwilioProtocolError(Close.INVALID_DATA, "start.mediaFormat must be an object")
    encoding, rate = media_format.get("encoding"), media_format.get("sampleRate")
    channels = media_format.get("channels", 1)
    if encoding != "audio/x-mulaw" or rate != TWILIO_RATE or channels != 1:
        raise TwilioProtocolError(
            Close.UNSUPPORTED,
            f"mediaFormat must be audio/x-mulaw 8000 Hz mono, got {encoding} {rate} Hz x{channels}",
        )
    parameters = body.get("customParameters") or {}
    custom = {str(k): str(v) for k, v in parameters.items()} if isinstance(parameters, dict) else {}
    return Start(stream_sid, str(body.get("callSid", "")), custom)


def _media(body: dict[str, Any]) -> Media:
    payload = body.get("payload")
    if not isinstance(payload, str):
        raise TwilioProtocolError(Close.INVALID_DATA, "media has no payload")
    try:
        audio = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise TwilioProtocolError(Close.INVALID_DATA, "media payload is not base64") from None
    return Media(audio, str(body.get("track", "inbound")))


# ----- out ------------------------------------------------------------------------------------------


def media_message(stream_sid: str, mulaw: bytes) -> dict[str, Any]:
    return {"event": "media", "streamSid": stream_sid, "media": {"payload": base64.b64encode(mulaw).decode()}}


def mark_message(stream_sid: str, name: str) -> dict[str, Any]:
    return {"event": "mark", "streamSid": stream_sid, "mark": {"name": name}}


def clear_message(stream_sid: str) -> dict[str, Any]:
    return {"event": "clear", "streamSid": stream_sid}


def connect_twiml(stream_url: str) -> str:
    """The TwiML that connects a call to the bidirectional stream at `stream_url` (wss://.../twilio)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Response><Connect><Stream url={quoteattr(stream_url)}/></Connect></Response>"
    )
