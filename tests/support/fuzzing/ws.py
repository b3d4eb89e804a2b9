"""/ws fuzzing: one connection runs a script of probes; every bad one must come back as an `error` event
with its documented code (docs/protocol.md), in order, and the connection must stay open (`session.end`
closes it with 1000)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.support.fuzzing.tally import Tally
from tests.support.fuzzing.values import (
    Probe,
    absurd_rate,
    is_json,
    json_text,
    not_json,
    random_json,
    random_scalar,
    random_text,
)

SUPPORTED_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


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


def ws_start(rng: random.Random) -> dict[str, Any]:
    """A valid session.start (any supported rate, sometimes extra fields)."""
    message: dict[str, Any] = {
        "type": "session.start",
        "audio": {"encoding": "pcm16", "sample_rate": rng.choice(SUPPORTED_RATES)},
    }
    if rng.random() < 0.3:
        message["version"] = 1
    if rng.random() < 0.2:
        message[random_text(rng, 8)] = random_json(rng, 2)
    return message


def ws_message(rng: random.Random, limit: int) -> str | bytes:
    """One hostile /ws message (sometimes a valid one)."""
    kind = rng.choices(
        ["value", "not_json", "type", "start", "text", "binary", "odd", "huge", "valid_text"],
        weights=[10, 10, 10, 15, 12, 12, 8, 5, 2],
    )[0]
    if kind == "value":  # JSON that is not an object
        return json_text(rng.choice([random_json(rng), [], [1, 2], "session.start", 0, None]), rng)
    if kind == "not_json":
        return not_json(rng, limit)
    if kind == "type":
        message = random_json(rng, 2) if rng.random() < 0.3 else {}
        message = message if isinstance(message, dict) else {}
        message["type"] = rng.choice(
            [random_scalar(rng), random_text(rng, 12), "session.Start", "input_text", ["x"]]
        )
        return json_text(message, rng)
    if kind == "start":
        message = ws_start(rng)
        mutation = rng.randrange(5)
        if mutation == 0:
            message["version"] = rng.choice([0, 2, "1", None, 1.5, [1], -1])
        elif mutation == 1:
            message["audio"] = rng.choice([None, "pcm16", 16000, [], random_json(rng, 1)])
        elif mutation == 2:
            message["audio"]["encoding"] = rng.choice(
                ["opus", "PCM16", "", None, 16, "mulaw", random_text(rng, 6)]
            )
        elif mutation == 3:
            message["audio"]["sample_rate"] = absurd_rate(rng)
        else:
            message.pop("audio") if rng.random() < 0.5 else message["audio"].pop("sample_rate")
        return json_text(message, rng)
    if kind in ("text", "valid_text"):
        text: Any = random_text(rng, 30) or "hi"
        if kind == "text":
            text = rng.choice([None, 5, [], {"t": 1}, "", "   \n\t", "x" * rng.randint(2001, 4000), True])
        message = {"type": "input.text", "text": text}
        if rng.random() < 0.1:
            message.pop("text")
        return json_text(message, rng)
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
        if isinstance(message, str) and expect is None and is_json(message):
            if json.loads(message).get("type") == "session.start":
                started = True
            elif json.loads(message).get("type") == "session.end":
                continue  # the script ends with its own session.end
        probes.append(Probe(message, expect))
    return probes


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
