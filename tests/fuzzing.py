"""Hostile input for the gateway and the engine server: seeded generators, the servers to aim them at, and
drivers that check every answer. tests/gateway/test_fuzz.py runs a short round; bench/fuzz.py a long one.

Generators take a `random.Random` and return `Probe`s: what to send and what the protocol (docs/protocol.md,
the OpenAI error rules of engine/server/protocol.py) says the server must answer. The expectations come from
small oracles written from the documented rules, not from the server's own parsers.

- /ws: one connection runs a script of probes; every bad one must come back as an `error` event with its
  documented code, in order, and the connection must stay open (`session.end` closes it with 1000).
- /twilio: a valid call (connected, start, media, marks, dtmf, unknown events) ends with one bad message,
  which must close the stream with its documented code and a reason (or `stop`: 1000).
- POST /webrtc/offer: bodies and mutated SDP offers; each must get a JSON answer or a 4xx/503 JSON error.
- The engine server (/v1/*): malformed and mutated OpenAI requests; never a 5xx, bad ones a 4xx error object.
- Slow-loris: sockets that send a request a byte at a time, or never finish its headers or its body.

Servers run in their own processes (`python -m tests.fuzzing gateway|engine --port P`), their logs captured:
a crash is the process exiting, an unhandled exception is a "Traceback", "Exception in ASGI application" or
an ERROR line in its log (`log_faults`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import json
import logging
import random
import string
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from tests.servers import free_port, stop_process, wait_until_healthy

ROOT = Path(__file__).resolve().parents[1]
SUPPORTED_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
WS_CODES_BEFORE_START = {
    "bad_json",
    "unknown_type",
    "bad_message",
    "unsupported_version",
    "unsupported_audio",
}
ENGINE_MODEL = "tiny"
ENGINE_KEY = "engine-fuzz-key"
LOG_FAULTS = ("Traceback", "Exception in ASGI application", "ERROR", "CRITICAL")


# ----- results --------------------------------------------------------------------------------------


class Pacer:
    """Spreads the sends of every driver sharing it to `rate` a second (None: as fast as they go)."""

    def __init__(self, rate: float | None = None) -> None:
        self.rate, self._next = rate, 0.0

    async def wait(self) -> None:
        if self.rate is None:
            return
        now = time.monotonic()
        slot = max(self._next, now)
        self._next = slot + 1 / self.rate
        await asyncio.sleep(slot - now)


@dataclass
class Tally:
    """What a fuzzing run sent and how the servers answered (and the pace all drivers share)."""

    sent: Counter[str] = field(default_factory=Counter)  # messages, by target
    answered: Counter[str] = field(default_factory=Counter)  # bad messages answered as documented, by target
    bad: Counter[str] = field(default_factory=Counter)  # bad messages sent, by target
    mismatches: list[str] = field(default_factory=list)  # unexpected answers (the first 50)
    n_mismatches: int = 0
    unprocessed: Counter[str] = field(default_factory=Counter)  # sent after the server had closed (cap)
    pacer: Pacer = field(default_factory=Pacer)

    def mismatch(self, target: str, what: str) -> None:
        self.n_mismatches += 1
        if len(self.mismatches) < 50:
            self.mismatches.append(f"{target}: {what}")

    @property
    def messages(self) -> int:
        return sum(self.sent.values())

    def summary(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "sent": dict(self.sent),
            "bad": dict(self.bad),
            "answered": dict(self.answered),
            "bad_unprocessed": dict(self.unprocessed),
            "mismatches": self.n_mismatches,
            "first_mismatches": self.mismatches[:10],
        }


def log_faults(log: str) -> list[str]:
    """The lines of a server log that show an unhandled exception or an error."""
    return [line for line in log.splitlines() if any(mark in line for mark in LOG_FAULTS)]


# ----- JSON-ish values ------------------------------------------------------------------------------


def _text(rng: random.Random, longest: int = 40) -> str:
    """Random text: ASCII, control characters, and other planes (no lone surrogates: not UTF-8)."""
    alphabet = rng.choice(
        [string.printable, string.ascii_letters, '\x00\x01\x1b\t\n"\\{}[]:,', "éü中文😀\u200b\ufeff\u202e"]
    )
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))


def _scalar(rng: random.Random) -> Any:
    return rng.choice(
        [
            None,
            True,
            False,
            0,
            -1,
            1,
            2**63,
            -(2**70),
            10**30,
            rng.randint(-100000, 100000),
            0.5,
            -1e308,
            1e308,
            rng.random(),
            "",
            " ",
            _text(rng),
            "16000",
            "pcm16",
            "session.start",
        ]
    )


def random_json(rng: random.Random, depth: int = 3) -> Any:
    """Any JSON value, a few levels deep."""
    if depth <= 0 or rng.random() < 0.5:
        return _scalar(rng)
    if rng.random() < 0.5:
        return [random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return {_text(rng, 8): random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))}


def _dumps(value: Any, rng: random.Random) -> str:
    """JSON text, sometimes with NaN/Infinity spelled out (Python's json reads them)."""
    text = json.dumps(value, allow_nan=True)
    return text if rng.random() < 0.9 else text.replace("0.5", "NaN").replace("1e+308", "Infinity")


def deep_nesting(rng: random.Random, limit: int) -> str:
    """'[[[[...]]]]' (or objects) as deep as fits in `limit` bytes: a stack bomb for recursive parsers."""
    depth = rng.randint(1000, max(1001, limit // 6 - 1))  # 6 bytes a level for objects: within the limit
    return rng.choice([("[" * depth) + ("]" * depth), '{"a":' * depth + "1" + "}" * depth, "[" * depth])


def not_json(rng: random.Random, limit: int) -> str:
    """Text that is not JSON."""
    valid = json.dumps({"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}})
    choice = rng.randrange(6)
    if choice == 0:
        return ""
    if choice == 1:
        return valid[: rng.randint(1, len(valid) - 1)]  # truncated
    if choice == 2:
        return deep_nesting(rng, limit)
    if choice == 3:
        return "x" + _text(rng, 200)
    if choice == 4:
        return "{" + _text(rng, 60)
    huge_int = '{"type": "session.start", "version": ' + "9" * rng.randint(4301, 9000) + "}"
    return rng.choice(
        ["nan", "undefined", "{'type': 'session.start'}", "\x00", "\ufeff{}", "{}}", "[1,]", huge_int]
    )


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


# ----- /ws ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One message and what must come back: an error code (/ws), a close code (/twilio), or None (none)."""

    payload: str | bytes
    expect: Any = None


def ws_expectation(message: str | bytes, started: bool, limit: int) -> str | None:
    """The /ws error code docs/protocol.md gives this message, or None (it is taken)."""
    size = len(message) if isinstance(message, bytes) else len(message.encode())
    if size > limit:
        return "message_too_large"
    if isinstance(message, bytes):
        if not started:
            return "not_started"
        return "bad_audio" if len(message) % 2 else None
    try:
        value = json.loads(message)
    except (ValueError, RecursionError):
        return "bad_json"
    if not isinstance(value, dict):
        return "bad_json"
    kind = value.get("type")
    if kind == "session.start":
        problem = _session_start_problem(value)
        return problem or ("already_started" if started else None)
    if kind == "input.text":
        text = value.get("text")
        if not isinstance(text, str) or not text.strip() or len(text) > 2000:
            return "bad_message"
        return None if started else "not_started"
    if kind == "session.end":
        return None
    return "unknown_type"


def _session_start_problem(value: dict[str, Any]) -> str | None:
    if value.get("version", 1) != 1:
        return "unsupported_version"
    audio = value.get("audio", {})
    if not isinstance(audio, dict):
        return "bad_message"
    if audio.get("encoding", "pcm16") != "pcm16":
        return "unsupported_audio"
    rate = audio.get("sample_rate", 16000)
    if isinstance(rate, bool) or not isinstance(rate, int) or rate not in SUPPORTED_RATES:
        return "unsupported_audio"
    return None


def _absurd_rate(rng: random.Random) -> Any:
    return rng.choice(
        [
            0,
            -16000,
            1,
            7999,
            16001,
            96000,
            10**12,
            2**64,
            16000.0,
            16000.5,
            "16000",
            None,
            True,
            [16000],
            {"hz": 16000},
            float("inf"),
            rng.randint(-(10**6), 10**6),
        ]
    )


def ws_start(rng: random.Random) -> dict[str, Any]:
    """A valid session.start (any supported rate, sometimes extra fields)."""
    message: dict[str, Any] = {
        "type": "session.start",
        "audio": {"encoding": "pcm16", "sample_rate": rng.choice(SUPPORTED_RATES)},
    }
    if rng.random() < 0.3:
        message["version"] = 1
    if rng.random() < 0.2:
        message[_text(rng, 8)] = random_json(rng, 2)
    return message


def ws_message(rng: random.Random, limit: int) -> str | bytes:
    """One hostile /ws message (sometimes a valid one)."""
    kind = rng.choices(
        ["value", "not_json", "type", "start", "text", "binary", "odd", "huge", "valid_text"],
        weights=[10, 10, 10, 15, 12, 12, 8, 5, 2],
    )[0]
    if kind == "value":  # JSON that is not an object
        return _dumps(rng.choice([random_json(rng), [], [1, 2], "session.start", 0, None]), rng)
    if kind == "not_json":
        return not_json(rng, limit)
    if kind == "type":
        message = random_json(rng, 2) if rng.random() < 0.3 else {}
        message = message if isinstance(message, dict) else {}
        message["type"] = rng.choice([_scalar(rng), _text(rng, 12), "session.Start", "input_text", ["x"]])
        return _dumps(message, rng)
    if kind == "start":
        message = ws_start(rng)
        mutation = rng.randrange(5)
        if mutation == 0:
            message["version"] = rng.choice([0, 2, "1", None, 1.5, [1], -1])
        elif mutation == 1:
            message["audio"] = rng.choice([None, "pcm16", 16000, [], random_json(rng, 1)])
        elif mutation == 2:
            message["audio"]["encoding"] = rng.choice(["opus", "PCM16", "", None, 16, "mulaw", _text(rng, 6)])
        elif mutation == 3:
            message["audio"]["sample_rate"] = _absurd_rate(rng)
        else:
            message.pop("audio") if rng.random() < 0.5 else message["audio"].pop("sample_rate")
        return _dumps(message, rng)
    if kind in ("text", "valid_text"):
        text: Any = _text(rng, 30) or "hi"
        if kind == "text":
            text = rng.choice([None, 5, [], {"t": 1}, "", "   \n\t", "x" * rng.randint(2001, 4000), True])
        message = {"type": "input.text", "text": text}
        if rng.random() < 0.1:
            message.pop("text")
        return _dumps(message, rng)
    if kind == "binary":
        return rng.randbytes(2 * rng.randint(0, min(limit // 2, 2000)))
    if kind == "odd":
        return rng.randbytes(2 * rng.randint(0, 1000) + 1)
    size = rng.randint(limit + 1, 2 * limit)  # huge: over the limit, under uvicorn's own 16x cut-off
    return rng.randbytes(size) if rng.random() < 0.5 else "x" * size


def ws_script(rng: random.Random, n: int, limit: int) -> list[Probe]:
    """`n` probes for one /ws connection, each with the error code it must get (None: no error)."""
    started = False
    probes: list[Probe] = []
    for _ in range(n):
        message = ws_message(rng, limit)
        if not started and rng.random() < 0.1:
            message = json.dumps(ws_start(rng))
        expect = ws_expectation(message, started, limit)
        if isinstance(message, str) and expect is None and _is_json(message):
            if json.loads(message).get("type") == "session.start":
                started = True
            elif json.loads(message).get("type") == "session.end":
                continue  # the script ends with its own session.end
        probes.append(Probe(message, expect))
    return probes


@dataclass
class WsOutcome:
    errors: list[str]
    close: tuple[int, str] | None


async def _read_ws(ws: Any, errors: list[str]) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for raw in ws:
            if isinstance(raw, str):
                event = json.loads(raw)
                if event.get("type") == "error" and event.get("code") != "turn_failed":
                    errors.append(str(event["code"]))


async def run_ws_script(url: str, probes: Sequence[Probe], tally: Tally, timeout_s: float = 60.0) -> None:
    """Sends the probes on one /ws connection, then session.end; checks the answers and the close."""
    expected = [p.expect for p in probes if p.expect is not None]
    errors: list[str] = []
    async with connect(url, max_size=None, open_timeout=timeout_s, close_timeout=5) as ws:
        reader = asyncio.create_task(_read_ws(ws, errors))
        try:
            for probe in probes:
                await tally.pacer.wait()
                await ws.send(probe.payload)
            await ws.send(json.dumps({"type": "session.end"}))
            async with asyncio.timeout(timeout_s):
                await reader
        except ConnectionClosed:
            pass
        finally:
            reader.cancel()
            await asyncio.wait({reader})  # (suppressing CancelledError here would swallow our own)
        close = (ws.close_code or 1006, ws.close_reason or "")
    tally.sent["ws"] += len(probes) + 1
    tally.bad["ws"] += len(expected)
    _check_ws(errors, expected, close, tally)


def _check_ws(errors: list[str], expected: list[str], close: tuple[int, str], tally: Tally) -> None:
    if "session_limit" in errors:  # refused at the cap: closed with 1013; the server read no further
        at = errors.index("session_limit")
        if errors[:at] != expected[:at] or close[0] != 1013:
            tally.mismatch("ws", f"at the cap: errors {errors[: at + 1]} close {close}")
        tally.answered["ws"] += at
        tally.unprocessed["ws"] += len(expected) - at
        tally.bad["ws"] -= len(expected) - at
        return
    if errors != expected:
        first = next(
            (i for i, (a, b) in enumerate(zip(errors, expected, strict=False)) if a != b),
            min(len(errors), len(expected)),
        )
        tally.mismatch(
            "ws", f"error #{first}: got {errors[first : first + 3]}, expected {expected[first : first + 3]}"
        )
    tally.answered["ws"] += sum(1 for a, b in zip(errors, expected, strict=False) if a == b)
    if close != (1000, "session ended"):
        tally.mismatch("ws", f"closed with {close} after session.end")


# ----- /twilio --------------------------------------------------------------------------------------

TWILIO_FORMAT = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}


def twilio_start(rng: random.Random, sid: str = "MZfuzz") -> dict[str, Any]:
    start = {
        "streamSid": sid,
        "accountSid": "AC0",
        "callSid": _text(rng, 10),
        "tracks": ["inbound"],
        "mediaFormat": dict(TWILIO_FORMAT),
        "customParameters": rng.choice([{}, {"a": 1}, None, [1]]),
    }
    return {"event": "start", "sequenceNumber": "1", "streamSid": sid, "start": start}


def twilio_valid(rng: random.Random) -> dict[str, Any]:
    """A message Twilio may send during a call (media, mark, dtmf, an event we do not know)."""
    kind = rng.choices(["media", "mark", "dtmf", "unknown", "connected"], weights=[60, 15, 10, 10, 5])[0]
    if kind == "media":
        size = rng.choice([160, 160, 0, 1, 80, 320, rng.randint(0, 2000)])
        payload = base64.b64encode(rng.randbytes(size) if rng.random() < 0.3 else b"\xff" * size).decode()
        media = {
            "track": rng.choice(["inbound", "outbound", "inbound_track", _text(rng, 6)]),
            "chunk": "1",
            "timestamp": "0",
            "payload": payload,
        }
        return {"event": "media", "streamSid": "MZfuzz", "media": media}
    if kind == "mark":
        name = rng.choice(
            [
                "1:800",
                "0:0",
                "99999999999999999999:1",
                "1:99999999999",
                _text(rng, 12),
                ":",
                "",
                "9" * 5000 + ":1",
            ]
        )
        return {"event": "mark", "streamSid": "MZfuzz", "mark": {"name": name}}
    if kind == "dtmf":
        return {
            "event": "dtmf",
            "dtmf": {"track": "inbound_track", "digit": rng.choice(["1", "#", "", "99"])},
        }
    if kind == "unknown":
        return {
            "event": rng.choice(["future", "media2", "", "START", _text(rng, 10)]),
            "data": random_json(rng, 1),
        }
    return {"event": "connected", "protocol": "Call", "version": "1.0.0"}


def twilio_ending(rng: random.Random, limit: int) -> Probe:
    """The message that ends a started call, and the close code it must bring."""
    kind = rng.choices(
        ["binary", "not_json", "value", "no_event", "body", "payload", "base64", "start", "big", "stop"],
        weights=[8, 10, 8, 8, 8, 8, 15, 10, 5, 20],
    )[0]
    media = {"event": "media", "streamSid": "MZfuzz"}
    if kind == "binary":
        return Probe(rng.randbytes(rng.randint(0, 400)), 1007)
    if kind == "not_json":
        return Probe(not_json(rng, limit) or "{", 1007)
    if kind == "value":
        return Probe(_dumps(rng.choice([[], [1], 5, "media", None, True]), rng), 1007)
    if kind == "no_event":
        return Probe(
            _dumps(
                rng.choice(
                    [{}, {"event": None}, {"event": 5}, {"event": ["media"]}, {"media": {"payload": ""}}]
                ),
                rng,
            ),
            1007,
        )
    if kind == "body":
        event = rng.choice(["media", "mark", "start", "dtmf", "stop"])
        return Probe(_dumps({"event": event, event: rng.choice([5, "x", [1], True])}, rng), 1007)
    if kind == "payload":
        return Probe(_dumps({**media, "media": {"payload": rng.choice([None, 5, [], {"b": 1}])}}, rng), 1007)
    if kind == "base64":
        payload = rng.choice(
            ["%%%", "abc", "A", "=AAA", "AAAA=", "AA AA", "AAA\n", "é" * 4, _text(rng, 20) + "*"]
        )
        expect = 1007 if not _valid_base64(payload) else None
        return Probe(json.dumps({**media, "media": {"payload": payload}}), expect)
    if kind == "start":
        return Probe(json.dumps(twilio_start(rng)), 1008)  # a second start
    if kind == "big":
        payload = "A" * rng.randint(limit, 2 * limit)
        return Probe(json.dumps({**media, "media": {"payload": payload}}), 1009)
    return Probe(json.dumps({"event": "stop", "streamSid": "MZfuzz", "stop": {}}), 1000)


def _valid_base64(payload: str) -> bool:
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def twilio_bad_start(rng: random.Random) -> Probe:
    """A start Twilio would never send (or none at all: media before start), and its close code."""
    message = twilio_start(rng)
    kind = rng.randrange(5)
    if kind == 0:
        message["start"]["mediaFormat"]["sampleRate"] = _absurd_rate(rng)
        rate = message["start"]["mediaFormat"]["sampleRate"]
        return Probe(json.dumps(message, allow_nan=True), None if rate == 8000 else 4415)
    if kind == 1:
        message["start"]["mediaFormat"] = rng.choice([None, "audio/x-mulaw", [8000], 8000])
        return Probe(json.dumps(message), 1007)
    if kind == 2:
        message["start"]["mediaFormat"] = {
            **TWILIO_FORMAT,
            rng.choice(["encoding", "channels"]): _scalar(rng),
        }
        fmt = message["start"]["mediaFormat"]
        ok = fmt["encoding"] == "audio/x-mulaw" and fmt["channels"] == 1
        return Probe(json.dumps(message, allow_nan=True), None if ok else 4415)
    if kind == 3:
        message["start"]["streamSid"] = rng.choice([None, "", 5, ["MZ"]])
        message.pop("streamSid")
        return Probe(json.dumps(message), 1007)
    out_of_order = twilio_valid(rng)
    event = out_of_order["event"]
    return Probe(json.dumps(out_of_order), 1008 if event in ("media", "mark", "dtmf") else None)


def twilio_script(rng: random.Random, n: int, limit: int) -> tuple[list[Probe], Probe]:
    """A call: `n` valid messages after connected and start, then the message that ends it."""
    if rng.random() < 0.25:
        bad = twilio_bad_start(rng)
        if bad.expect is not None:
            return [Probe(json.dumps({"event": "connected"}))], bad
        return [bad], Probe(json.dumps({"event": "stop"}), 1000)  # it was a valid start after all
    prefix = [
        Probe(json.dumps({"event": "connected", "protocol": "Call"})),
        Probe(json.dumps(twilio_start(rng))),
    ]
    prefix += [Probe(json.dumps(twilio_valid(rng))) for _ in range(n)]
    ending = twilio_ending(rng, limit)
    if ending.expect is None:
        prefix.append(ending)
        ending = Probe(json.dumps({"event": "stop"}), 1000)
    return prefix, ending


async def run_twilio_script(url: str, prefix: Sequence[Probe], ending: Probe, tally: Tally) -> None:
    """A call that ends with `ending`: the stream must close with its code and a reason."""
    async with connect(url, max_size=None, open_timeout=60, close_timeout=5) as ws:
        try:
            for probe in [*prefix, ending]:
                await tally.pacer.wait()
                await ws.send(probe.payload)
            async with asyncio.timeout(60):
                async for _ in ws:  # the agent's media and marks, until the close
                    pass
        except ConnectionClosed:
            pass
        close = (ws.close_code or 1006, ws.close_reason or "")
    tally.sent["twilio"] += len(prefix) + 1
    if ending.expect != 1000:
        tally.bad["twilio"] += 1
    if close[0] == ending.expect and close[1]:
        tally.answered["twilio"] += ending.expect != 1000
    elif close[0] == 1013 and close[1]:  # refused at the session cap: also an answer with a reason
        tally.answered["twilio"] += ending.expect != 1000
    else:
        tally.mismatch("twilio", f"{str(ending.payload)[:80]!r}: closed {close}, expected {ending.expect}")


# ----- POST /webrtc/offer -----------------------------------------------------------------------------


async def sample_offer() -> str:
    """A real browser-like offer from aiortc: an audio track and the `events` data channel."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        pc.createDataChannel("events")
        offer = await pc.createOffer()
        return str(offer.sdp)
    finally:
        await pc.close()


def mutate_sdp(rng: random.Random, sdp: str) -> str:
    """The offer with a few lines broken: deleted, repeated, garbled, numbers made absurd, cut short."""
    lines = sdp.split("\r\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        kind = rng.randrange(6)
        if kind == 0:
            del lines[i]
        elif kind == 1:
            lines.insert(i, lines[i])
        elif kind == 2:
            lines[i] = lines[i][:2] + _text(rng, 30)
        elif kind == 3:
            lines[i] = "".join(str(rng.choice([-1, 0, 2**64, 99999])) if c.isdigit() else c for c in lines[i])
        elif kind == 4:
            lines = lines[:i] + ["m=audio"]
        else:
            lines[i] = lines[i].replace(" ", rng.choice(["", "  ", "\t", "\x00"]))
        if not lines:
            lines = ["m=audio"]
    return "\r\n".join(lines)


def offer_probe(rng: random.Random, sdp: str, limit: int) -> tuple[bytes, set[int]]:
    """A POST /webrtc/offer body and the statuses allowed for it (400 for every broken request)."""
    kind = rng.choices(
        ["not_json", "value", "fields", "no_audio", "big", "mutated"], weights=[15, 10, 20, 10, 5, 40]
    )[0]
    if kind == "not_json":
        return not_json(rng, limit).encode() or rng.randbytes(rng.randint(1, 50)), {400}
    if kind == "value":
        return _dumps(random_json(rng), rng).encode(), {400}
    if kind == "fields":
        body = {"type": rng.choice(["offer", "answer", None, 5]), "sdp": rng.choice([None, 5, [], sdp])}
        ok = body["type"] == "offer" and isinstance(body["sdp"], str)
        return json.dumps(body).encode(), {200, 400, 503} if ok else {400}
    if kind == "no_audio":
        return json.dumps({"type": "offer", "sdp": sdp.replace("m=audio", "m=video")}).encode(), {400}
    if kind == "big":
        return json.dumps({"type": "offer", "sdp": sdp + "a=x:" + "y" * (limit + 1)}).encode(), {413}
    return json.dumps({"type": "offer", "sdp": mutate_sdp(rng, sdp)}).encode(), {200, 400, 503}


async def run_offers(
    http: httpx.AsyncClient, rng: random.Random, sdp: str, n: int, limit: int, tally: Tally
) -> None:
    for _ in range(n):
        body, allowed = offer_probe(rng, sdp, limit)
        await tally.pacer.wait()
        tally.sent["webrtc"] += 1
        try:
            response = await http.post(
                "/webrtc/offer", content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as error:
            tally.mismatch("webrtc", f"{body[:60]!r}: {type(error).__name__} {error}")
            continue
        bad = allowed == {400} or allowed == {413}
        tally.bad["webrtc"] += bad
        answer = _json_or_none(response)
        if response.status_code not in allowed or not isinstance(answer, dict):
            tally.mismatch("webrtc", f"{body[:60]!r}: {response.status_code} {response.text[:100]}")
        elif response.status_code == 200:
            if answer.get("type") != "answer":
                tally.mismatch("webrtc", f"200 without an answer: {response.text[:100]}")
        elif answer.get("type") == "error" and answer.get("message"):
            tally.answered["webrtc"] += bad
        else:
            tally.mismatch("webrtc", f"{response.status_code} without an error object: {response.text[:100]}")


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


# ----- the engine server ------------------------------------------------------------------------------

AUTH = {"Authorization": f"Bearer {ENGINE_KEY}"}


def _chat_request(rng: random.Random) -> dict[str, Any]:
    messages = [
        {"role": rng.choice(["system", "user", "assistant", "developer"]), "content": _text(rng, 30)}
        for _ in range(rng.randint(1, 3))
    ]
    return {
        "model": ENGINE_MODEL,
        "messages": messages,
        "max_tokens": rng.randint(1, 6),
        "stream": rng.random() < 0.4,
    }


def _mutate_request(rng: random.Random, request: dict[str, Any]) -> dict[str, Any]:
    fields = [
        "model",
        "messages",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "n",
        "presence_penalty",
        "logprobs",
        "tools",
        "max_completion_tokens",
        "prompt",
    ]
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(fields)
        value = rng.choice(
            [
                _scalar(rng),
                random_json(rng, 2),
                [_text(rng, 5)] * rng.randint(0, 20),
                [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                [{"role": "user", "content": rng.choice([None, 5, [], [{"type": "image"}]])}],
            ]
        )
        request[name] = value
    return request


def engine_probe(rng: random.Random) -> tuple[str, str, dict[str, str], bytes, set[int]]:
    """(method, path, headers, body, allowed statuses): 2xx only where the request may be valid."""
    kind = rng.choices(
        ["valid", "mutated", "not_json", "value", "auth", "route", "completion", "big"],
        weights=[8, 45, 10, 8, 8, 6, 12, 3],
    )[0]
    chat, client_error = "/v1/chat/completions", set(range(400, 430))
    if kind == "valid":
        return "POST", chat, AUTH, json.dumps(_chat_request(rng)).encode(), {200}
    if kind == "mutated":
        body = _mutate_request(rng, _chat_request(rng))
        return "POST", chat, AUTH, _dumps(body, rng).encode(), {200} | client_error
    if kind == "not_json":
        return "POST", rng.choice([chat, "/v1/completions"]), AUTH, not_json(rng, 65536).encode(), {400}
    if kind == "value":
        return (
            "POST",
            chat,
            AUTH,
            _dumps(rng.choice([[], 5, "x", None, [{"model": "tiny"}]]), rng).encode(),
            {400},
        )
    if kind == "auth":
        headers = rng.choice(
            [
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": f"Basic {ENGINE_KEY}"},
                {"X-API-Key": ENGINE_KEY},
                {"Authorization": ENGINE_KEY},
                {"Authorization": f"Bearer {ENGINE_KEY}x"},
            ]
        )
        path = rng.choice([chat, "/v1/completions", "/v1/models", f"/v1/models?api_key={ENGINE_KEY}"])
        method = "GET" if path.startswith("/v1/models") else "POST"
        return method, path, headers, json.dumps(_chat_request(rng)).encode(), {401}
    if kind == "route":
        method, path = rng.choice(
            [
                ("GET", chat),
                ("PUT", "/v1/completions"),
                ("POST", "/v1/models"),
                ("GET", "/v1/nothing"),
                ("DELETE", "/health"),
                ("GET", "/" + quote(_text(rng, 10))),
            ]
        )
        return method, path, AUTH, b"", {404, 405, 400}
    if kind == "completion":
        prompt = rng.choice(
            [
                _text(rng, 20) or "a",
                [rng.randint(-5, 200) for _ in range(rng.randint(0, 5))],
                [],
                [""],
                ["a", "b"],
                5,
                None,
            ]
        )
        body = {"model": ENGINE_MODEL, "prompt": prompt, "max_tokens": rng.choice([1, 4, 0, -1, 10**9])}
        return "POST", "/v1/completions", AUTH, json.dumps(body).encode(), {200} | client_error
    return "POST", chat, AUTH, b'{"model": "tiny", "messages": [' + b" " * (5 * 2**20) + b"]}", {413}


async def run_engine_probes(http: httpx.AsyncClient, rng: random.Random, n: int, tally: Tally) -> None:
    for _ in range(n):
        method, path, headers, body, allowed = engine_probe(rng)
        await tally.pacer.wait()
        tally.sent["engine"] += 1
        try:
            response = await http.request(
                method, path, content=body, headers={**headers, "Content-Type": "application/json"}
            )
        except httpx.HTTPError as error:
            tally.mismatch("engine", f"{method} {path} {body[:60]!r}: {type(error).__name__} {error}")
            continue
        bad = 200 not in allowed
        tally.bad["engine"] += bad
        if response.status_code not in allowed:
            tally.mismatch(
                "engine", f"{method} {path} {body[:60]!r}: {response.status_code} {response.text[:120]}"
            )
        elif response.status_code >= 400:
            error = (_json_or_none(response) or {}).get("error")
            if isinstance(error, dict) and error.get("message"):
                tally.answered["engine"] += bad
            else:
                tally.mismatch(
                    "engine", f"{response.status_code} without an error object: {response.text[:100]}"
                )
        elif (
            "text/event-stream" in response.headers.get("content-type", "")
            and "data: [DONE]" not in response.text
        ):
            tally.mismatch("engine", f"a stream that did not end with [DONE]: {response.text[-100:]}")


# ----- slow-loris -----------------------------------------------------------------------------------


@dataclass
class LorisReport:
    opened: int = 0
    answered: list[str] = field(default_factory=list)  # the first line of each answer (e.g. "HTTP/1.1 408")
    still_open: int = 0


async def _loris(
    host: str, port: int, request: bytes, stop_after: int, delay_s: float, report: LorisReport
) -> None:
    """Sends `request` one byte at a time, `delay_s` apart, stopping after `stop_after` bytes (never
    finishing), then waits for the server's answer or close."""
    reader, writer = await asyncio.open_connection(host, port)
    report.opened += 1
    try:
        for byte in request[:stop_after]:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(delay_s)
        answer = await reader.read(200)
        report.answered.append(answer.split(b"\r\n", 1)[0].decode(errors="replace") or "(closed)")
    except (ConnectionError, OSError):
        report.answered.append("(reset)")
    except asyncio.CancelledError:
        report.still_open += 1
        raise
    finally:
        writer.close()


def loris_requests(host: str, paths: Sequence[str]) -> list[tuple[bytes, int]]:
    """(request, bytes to send of it): a request that never finishes its headers, and POSTs to `paths`
    whose bodies never finish."""

    def post(path: str) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {ENGINE_KEY}\r\nContent-Length: 2000\r\n\r\n"
            '{"type": "offer", '
        ).encode()

    headers_only = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode() + b"a" * 50
    return [(headers_only, len(headers_only)), *((post(path), len(post(path))) for path in paths)]


async def slow_loris(
    host: str, port: int, paths: Sequence[str], n: int, delay_s: float, hold_s: float
) -> LorisReport:
    """`n` slow-loris connections for `hold_s` seconds; the report says which were answered."""
    report = LorisReport()
    requests = loris_requests(f"{host}:{port}", paths)
    tasks = [
        asyncio.create_task(_loris(host, port, *requests[i % len(requests)], delay_s, report))
        for i in range(n)
    ]
    await asyncio.wait(tasks, timeout=hold_s)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return report


# ----- a healthy session beside the fuzzing ------------------------------------------------------------


@dataclass
class TurnTimes:
    server_ms: list[float] = field(default_factory=list)  # turn.metrics voice_to_voice (typed: from arrival)
    client_ms: list[float] = field(default_factory=list)  # input.text sent -> first audio frame received
    failed: int = 0


async def healthy_turns(url: str, stop: threading.Event, times: TurnTimes, gap_s: float = 0.2) -> None:
    """A /ws session that types a question, waits for the whole answer, and again, until `stop`."""
    async with connect(url, max_size=None) as ws:
        await ws.send(
            json.dumps({"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}})
        )
        while json.loads(await ws.recv()).get("type") != "session.started":
            pass
        while not stop.is_set():
            sent = time.monotonic()
            await ws.send(json.dumps({"type": "input.text", "text": "How are you?"}))
            first_audio: float | None = None
            while True:
                message = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(message, bytes):
                    first_audio = first_audio or time.monotonic()
                    continue
                event = json.loads(message)
                if event["type"] == "error":
                    times.failed += 1
                if event["type"] == "turn.metrics":
                    break
            latency = event["latency_ms"]["voice_to_voice"]
            if event["outcome"] != "done" or latency is None or first_audio is None:
                times.failed += 1
            else:
                times.server_ms.append(latency)
                times.client_ms.append(1000 * (first_audio - sent))
            await asyncio.sleep(gap_s)
        await ws.send(json.dumps({"type": "session.end"}))


async def healthy_completions(url: str, stop: threading.Event, times: TurnTimes) -> None:
    """A client of the engine server asking short chat completions, one after another, until `stop`."""
    body = {"model": ENGINE_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http:
        while not stop.is_set():
            sent = time.monotonic()
            response = await http.post("/v1/chat/completions", json=body)
            if response.status_code == 200:
                times.client_ms.append(1000 * (time.monotonic() - sent))
            else:
                times.failed += 1
            await asyncio.sleep(0.05)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def describe(values: Sequence[float]) -> dict[str, float | int | None]:
    def rounded(q: float) -> float | None:
        value = percentile(values, q)
        return None if value is None else round(value, 1)

    return {"n": len(values), "p50": rounded(0.5), "p95": rounded(0.95), "max": rounded(1.0)}


# ----- servers in their own processes -----------------------------------------------------------------


@dataclass
class ServerProcess:
    """A fuzz target in a process of its own; `log()` is everything it wrote; `alive` until it crashed."""

    kind: str  # "gateway" | "engine"
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def server_process(
    kind: str, log_dir: Path, settings: dict[str, str] | None = None, timeout_s: float = 120.0
) -> Iterator[ServerProcess]:
    """Starts `python -m tests.fuzzing KIND --port P` and waits until it answers; stops it afterwards."""
    port = free_port()
    log_path = log_dir / f"{kind}-{port}.log"
    command = [sys.executable, "-m", "tests.fuzzing", kind, "--port", str(port)]
    command += [f"--set={name}={value}" for name, value in (settings or {}).items()]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(kind, port, log_path, process)
    try:
        path = "/healthz" if kind == "gateway" else "/health"
        wait_until_healthy(f"http://{server.url}", process, log_path, timeout_s, path)
        yield server
    finally:
        stop_process(process)


# ----- one fuzzing round over every target ------------------------------------------------------------


@dataclass
class Plan:
    """How many messages go where in one round (`messages` in all, roughly)."""

    messages: int
    seed: int = 0
    limit: int = 65536  # the gateway's VOICEAGENT_MAX_MESSAGE_BYTES
    ws_per_connection: int = 100
    twilio_per_call: int = 12
    parallel: int = 4
    loris: int = 24
    rate: float | None = None  # messages a second, all targets together (None: as fast as they go)

    @property
    def shares(self) -> dict[str, int]:
        return {
            "ws": int(self.messages * 0.6),
            "twilio": int(self.messages * 0.25),
            "webrtc": int(self.messages * 0.05),
            "engine": int(self.messages * 0.10),
        }


Progress = Callable[[Tally], None]


async def fuzz_gateway(host: str, plan: Plan, tally: Tally, progress: Progress) -> None:
    """The /ws, /twilio and /webrtc/offer shares of the plan, `plan.parallel` connections at a time."""
    rng = random.Random(plan.seed)
    shares = plan.shares
    sdp = await sample_offer()
    semaphore = asyncio.Semaphore(plan.parallel)

    async def one(job: Callable[[], Any]) -> None:
        async with semaphore:
            try:
                await job()
            except (OSError, InvalidHandshake, TimeoutError) as error:
                tally.mismatch("connection", f"{type(error).__name__}: {error}")
            progress(tally)

    jobs: list[Callable[[], Any]] = []
    for _ in range(max(1, shares["ws"] // plan.ws_per_connection)):
        probes = ws_script(random.Random(rng.random()), plan.ws_per_connection - 1, plan.limit)
        jobs.append(lambda probes=probes: run_ws_script(f"ws://{host}/ws", probes, tally))
    # a call averages ~12 messages: 3/4 are connected, start, 0-24 others and an ending; 1/4 end at the start
    for _ in range(max(1, -(-shares["twilio"] // (plan.twilio_per_call - 1)))):
        prefix, ending = twilio_script(
            random.Random(rng.random()), rng.randint(0, 2 * plan.twilio_per_call), plan.limit
        )
        jobs.append(lambda p=prefix, e=ending: run_twilio_script(f"ws://{host}/twilio", p, e, tally))
    rng.shuffle(jobs)
    async with httpx.AsyncClient(base_url=f"http://{host}", timeout=60) as http:
        offers = asyncio.create_task(
            run_offers(http, random.Random(rng.random()), sdp, shares["webrtc"], plan.limit, tally)
        )
        await asyncio.gather(*(one(job) for job in jobs))
        await offers


async def fuzz_engine(host: str, plan: Plan, tally: Tally, progress: Progress) -> None:
    rng = random.Random(plan.seed + 1)
    async with httpx.AsyncClient(base_url=f"http://{host}", timeout=60) as http:
        batch = 200
        for start in range(0, plan.shares["engine"], batch):
            await run_engine_probes(http, rng, min(batch, plan.shares["engine"] - start), tally)
            progress(tally)


async def check_refusals(host: str, tally: Tally) -> None:
    """Connections refused before any message: the WebSocket upgrade of a plain GET, a bogus path."""
    async with httpx.AsyncClient(base_url=f"http://{host}", timeout=10) as http:
        for path, allowed in (
            ("/ws", {400, 403, 404, 426}),
            ("/no/such/page", {404}),
            ("/twilio/voice", {404, 405}),
        ):
            response = await http.get(path)
            tally.sent["http"] += 1
            if response.status_code not in allowed:
                tally.mismatch("http", f"GET {path}: {response.status_code}")
    with contextlib.suppress(InvalidStatus):
        async with connect(f"ws://{host}/nothing-here"):
            tally.mismatch("http", "a WebSocket on a path that does not exist was accepted")


@contextlib.contextmanager
def in_thread(work: Callable[[threading.Event], Coroutine[Any, Any, None]]) -> Iterator[None]:
    """Runs `work(stop)` on an event loop in a thread of its own while the block runs (the healthy clients:
    the fuzzing's own load on this process's loop does not delay their measurements); then sets `stop`,
    waits for it, and raises what it raised."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(work(stop))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            errors.append(error)

    thread = threading.Thread(target=target, name="healthy-client", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
    if errors:
        raise errors[0]


@dataclass
class RoundResult:
    """One fuzzing round: the tally, the healthy clients before and during it, the servers' state."""

    tally: Tally
    baseline: dict[str, TurnTimes]
    during: dict[str, TurnTimes]
    loris: dict[str, LorisReport]
    alive: dict[str, bool]
    log_faults: dict[str, list[str]]
    seconds: float

    def summary(self) -> dict[str, Any]:
        def times(phase: dict[str, TurnTimes]) -> dict[str, Any]:
            return {
                "ws_turn_server_ms": describe(phase["ws"].server_ms),
                "ws_turn_client_ms": describe(phase["ws"].client_ms),
                "ws_failed_turns": phase["ws"].failed,
                "engine_request_ms": describe(phase["engine"].client_ms),
                "engine_failed_requests": phase["engine"].failed,
            }

        return {
            **self.tally.summary(),
            "crashes": sum(not alive for alive in self.alive.values()),
            "log_faults": {name: len(lines) for name, lines in self.log_faults.items()},
            "first_log_faults": [line for lines in self.log_faults.values() for line in lines][:10],
            "baseline": times(self.baseline),
            "during": times(self.during),
            "slow_loris": {
                name: {"opened": r.opened, "answered": Counter(r.answered), "still_open": r.still_open}
                for name, r in self.loris.items()
            },
            "seconds": round(self.seconds, 1),
        }


# Room for the WebRTC offers the fuzzing gets answered: each holds its session until ICE gives up (20 s).
GATEWAY_SETTINGS = {"max_sessions": "1000", "max_message_bytes": "65536"}


def fuzz_round(
    plan: Plan,
    log_dir: Path,
    baseline_s: float,
    loris_hold_s: float,
    progress: Progress,
    engine_settings: dict[str, str] | None = None,
) -> RoundResult:
    """Both servers in their own processes; the healthy clients alone for `baseline_s`, then again while
    the plan's messages and `plan.loris` slow-loris connections hit the same servers."""
    began = time.monotonic()
    settings = {**GATEWAY_SETTINGS, "max_message_bytes": str(plan.limit)}
    with (
        server_process("gateway", log_dir, settings) as gateway,
        server_process("engine", log_dir, engine_settings) as engine,
    ):

        def healthy(times: dict[str, TurnTimes]) -> contextlib.ExitStack:
            stack = contextlib.ExitStack()
            stack.enter_context(
                in_thread(lambda stop: healthy_turns(f"ws://{gateway.url}/ws", stop, times["ws"]))
            )
            stack.enter_context(
                in_thread(lambda stop: healthy_completions(f"http://{engine.url}", stop, times["engine"]))
            )
            return stack

        baseline = {"ws": TurnTimes(), "engine": TurnTimes()}
        with healthy(baseline):
            time.sleep(baseline_s)
        during = {"ws": TurnTimes(), "engine": TurnTimes()}
        tally, loris = Tally(pacer=Pacer(plan.rate)), {}
        with healthy(during):
            loris = asyncio.run(_fuzz_all(gateway, engine, plan, tally, progress, loris_hold_s))
        alive = {"gateway": gateway.alive, "engine": engine.alive}
    faults = {"gateway": log_faults(gateway.log()), "engine": log_faults(engine.log())}
    return RoundResult(tally, baseline, during, loris, alive, faults, time.monotonic() - began)


async def _fuzz_all(
    gateway: ServerProcess, engine: ServerProcess, plan: Plan, tally: Tally, progress: Progress, hold_s: float
) -> dict[str, LorisReport]:
    # per byte: 20 ms, so the headers are sent within ~4 s; the bodies then wait for the servers' timeouts
    gateway_loris = slow_loris(
        "127.0.0.1", gateway.port, ["/twilio/voice", "/webrtc/offer"], plan.loris // 2, 0.02, hold_s
    )
    engine_loris = slow_loris(
        "127.0.0.1", engine.port, ["/v1/chat/completions"], plan.loris // 2, 0.02, hold_s
    )
    reports = await asyncio.gather(
        gateway_loris,
        engine_loris,
        fuzz_gateway(gateway.url, plan, tally, progress),
        fuzz_engine(engine.url, plan, tally, progress),
        check_refusals(gateway.url, tally),
    )
    return {"gateway": reports[0], "engine": reports[1]}


# ----- the servers' entry points ----------------------------------------------------------------------


class FuzzTokenizer:
    """A tokenizer for a tiny random engine behind the HTTP API: each character is one id, and a chat
    template that joins the messages. Decodes like tests.fakes.FakeTokenizer."""

    eos_token_id = 0
    chat_template = "role: content"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1 + ord(c) % (self.vocab_size - 1) for c in text]

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, tokenize: bool = True
    ) -> list[int]:
        return self.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if i == 0 and skip_special_tokens else f" w{i}" for i in token_ids)


def _serve_gateway(port: int, settings: dict[str, str]) -> None:
    import uvicorn

    from tests.fakes import FakePipeline
    from voiceagent.config import Settings
    from voiceagent.gateway.app import build_app
    from voiceagent.gateway.serve import uvicorn_config
    from voiceagent.gateway.webrtc import routes

    app = build_app(FakePipeline(word_ms=20), Settings(**settings), routes())  # type: ignore[arg-type]
    config = uvicorn_config(app, app.state.hub.settings, "127.0.0.1", port)
    config.log_level = "info"
    _log_everything()
    uvicorn.Server(config).run()


def _serve_engine(port: int, settings: dict[str, str]) -> None:
    import uvicorn

    from engine.server.app import ServerConfig, build_app
    from engine.server.http_deadline import HeadersDeadline
    from tests.fakes import TINY_VOCAB, tiny_engine

    engine = tiny_engine(max_seq_len=512)
    engine.tokenizer = FuzzTokenizer(TINY_VOCAB)
    values = {name: json.loads(value) for name, value in settings.items()}  # numbers: body_timeout_s=5
    config = ServerConfig(model_name=ENGINE_MODEL, api_key=ENGINE_KEY, max_queue_len=64, **values)
    app = build_app(engine, config)
    uvicorn_config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="info", access_log=False, http=HeadersDeadline
    )
    _log_everything()
    uvicorn.Server(uvicorn_config).run()


def _log_everything() -> None:
    """Every logger at INFO with its level on each line, so an ERROR anywhere shows in the log."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)
    for name in ("uvicorn", "uvicorn.error", "voiceagent", "engine"):
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a fuzz target: the gateway on fakes, or the engine server")
    parser.add_argument("kind", choices=["gateway", "engine"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--set", action="append", default=[], help="a setting, NAME=VALUE")
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    (_serve_gateway if args.kind == "gateway" else _serve_engine)(args.port, settings)


if __name__ == "__main__":
    main()
