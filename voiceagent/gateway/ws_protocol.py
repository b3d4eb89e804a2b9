"""The /ws wire format (docs/protocol.md): client messages parsed into types, and every message the server
sends built here (the same events go over WebRTC's data channel).

`parse_client_message(text)` raises `ProtocolError(code, message)` for anything it cannot take; the
transport answers it with an `error` event and carries on. `event_message(event)` is the JSON a session
event becomes, or None for events that travel otherwise (audio as binary frames) or not at all; the other
builders are for what the gateway itself says (the session's start, the audio's framing, a turn's metrics).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from voiceagent.events import (
    Event,
    Interrupted,
    ReplyPaused,
    ReplyResumed,
    ReplyText,
    SpeechEnded,
    SpeechStarted,
    TranscriptFinal,
    TranscriptPartial,
    TurnError,
)
from voiceagent.gateway.inbound import SUPPORTED_RATES

PROTOCOL_VERSION = 1
MAX_TEXT_CHARS = 2000


class ProtocolError(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class SessionStart:
    sample_rate: int


@dataclass(frozen=True)
class InputText:
    text: str


@dataclass(frozen=True)
class SessionEnd:
    pass


ClientMessage = SessionStart | InputText | SessionEnd


def parse_client_message(raw: str) -> ClientMessage:
    try:
        message = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ProtocolError("bad_json", f"a text message must be a JSON object: {error}") from None
    except (ValueError, RecursionError):  # an integer of over 4300 digits; nesting deeper than Python goes
        raise ProtocolError("bad_json", "a text message must be a JSON object, not nested so deep") from None
    if not isinstance(message, dict):
        raise ProtocolError("bad_json", "a text message must be a JSON object")
    kind = message.get("type")
    if kind == "session.start":
        return _session_start(message)
    if kind == "input.text":
        text = message.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ProtocolError("bad_message", "input.text needs a non-empty string 'text'")
        if len(text) > MAX_TEXT_CHARS:
            raise ProtocolError("bad_message", f"input.text is limited to {MAX_TEXT_CHARS} characters")
        return InputText(text.strip())
    if kind == "session.end":
        return SessionEnd()
    raise ProtocolError(
        "unknown_type", f"unknown message type {str(kind)[:40]!r} (session.start, input.text, session.end)"
    )


def _session_start(message: dict[str, Any]) -> SessionStart:
    version = message.get("version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError("unsupported_version", f"this server speaks version {PROTOCOL_VERSION}")
    audio = message.get("audio", {"encoding": "pcm16", "sample_rate": 16000})
    if not isinstance(audio, dict):
        raise ProtocolError("bad_message", "session.start 'audio' must be an object")
    if audio.get("encoding", "pcm16") != "pcm16":
        raise ProtocolError("unsupported_audio", "audio.encoding must be 'pcm16' (16-bit little-endian mono)")
    rate = audio.get("sample_rate", 16000)
    if isinstance(rate, bool) or not isinstance(rate, int) or rate not in SUPPORTED_RATES:
        rates = ", ".join(map(str, SUPPORTED_RATES))
        raise ProtocolError("unsupported_audio", f"audio.sample_rate must be one of {rates}, got {rate!r}")
    return SessionStart(rate)


def event_message(event: Event) -> dict[str, Any] | None:
    """The JSON for a session event that travels as one (see docs/protocol.md), else None."""
    turn = event.turn_id
    if isinstance(event, SpeechStarted):
        return {"type": "vad.speech_start", "turn": turn}
    if isinstance(event, SpeechEnded):
        # waited_ms: the endpointing silence between the last voiced frame and this event, so a client can
        # time voice-to-voice latency from the end of speech (as the trace does), not from this message.
        waited_ms = max(0.0, (event.confirmed_ns - event.t_ns) / 1e6) if event.confirmed_ns else 0.0
        return {"type": "vad.speech_end", "turn": turn, "waited_ms": round(waited_ms, 3)}
    if isinstance(event, TranscriptPartial):
        return {"type": "transcript.partial", "turn": turn, "text": event.text, "stable": event.stable}
    if isinstance(event, TranscriptFinal):
        return {"type": "transcript.final", "turn": turn, "text": event.text}
    if isinstance(event, ReplyText):
        return {
            "type": "agent.block",
            "turn": turn,
            "text": event.text,
            "n_drafted": event.n_drafted,
            "n_accepted": event.n_accepted,
            "first": event.first,
        }
    if isinstance(event, TurnError):
        return error_message(event.code, event.message, stage=event.stage, turn=turn)
    if isinstance(event, Interrupted):
        return {"type": "interrupted", "turn": turn, "spoken_text": event.spoken_text}
    if isinstance(event, ReplyPaused):
        return {"type": "agent.paused", "turn": turn}
    if isinstance(event, ReplyResumed):
        return {"type": "agent.resumed", "turn": turn}
    return None


def error_message(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, **extra}


def session_started_message(
    session_id: str, encoding: str, sample_rate: int, transport: str | None = None
) -> dict[str, Any]:
    """The first event of a session; `transport` is named where it is not /ws (WebRTC)."""
    message: dict[str, Any] = {
        "type": "session.started",
        "version": PROTOCOL_VERSION,
        "session_id": session_id,
    }
    if transport is not None:
        message["transport"] = transport
    message["audio"] = {"encoding": encoding, "sample_rate": sample_rate}
    return message


def session_too_long_reason(limit_s: float) -> str:
    """The words for a session cut off at VOICEAGENT_MAX_SESSION_S (also the close reason on /ws)."""
    return f"the session reached its {limit_s:g} s limit"


def session_too_long_message(limit_s: float) -> dict[str, Any]:
    reason = session_too_long_reason(limit_s)
    return error_message("session_too_long", f"{reason} (VOICEAGENT_MAX_SESSION_S)")


def audio_start_message(turn: int, sample_rate: int) -> dict[str, Any]:
    return {"type": "agent.audio.start", "turn": turn, "sample_rate": sample_rate}


def audio_end_message(turn: int, samples: int, interrupted: bool) -> dict[str, Any]:
    return {"type": "agent.audio.end", "turn": turn, "samples": samples, "interrupted": interrupted}


def turn_metrics_message(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics`: what `LiveSession.finish_turn` returned."""
    return {"type": "turn.metrics", **metrics}
