"""/twilio fuzzing: a valid call (connected, start, media, marks, dtmf, unknown events) ends with one bad
message, which must close the stream with its documented code and a reason (or `stop`: 1000)."""

from __future__ import annotations

import asyncio
import base64
import binascii
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
    json_text,
    not_json,
    random_json,
    random_scalar,
    random_text,
)

TWILIO_FORMAT = {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}


def twilio_start(rng: random.Random, sid: str = "MZfuzz") -> dict[str, Any]:
    start = {
        "streamSid": sid,
        "accountSid": "AC0",
        "callSid": random_text(rng, 10),
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
            "track": rng.choice(["inbound", "outbound", "inbound_track", random_text(rng, 6)]),
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
                random_text(rng, 12),
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
            "event": rng.choice(["future", "media2", "", "START", random_text(rng, 10)]),
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
        return Probe(json_text(rng.choice([[], [1], 5, "media", None, True]), rng), 1007)
    if kind == "no_event":
        return Probe(
            json_text(
                rng.choice(
                    [{}, {"event": None}, {"event": 5}, {"event": ["media"]}, {"media": {"payload": ""}}]
                ),
                rng,
            ),
            1007,
        )
    if kind == "body":
        event = rng.choice(["media", "mark", "start", "dtmf", "stop"])
        return Probe(json_text({"event": event, event: rng.choice([5, "x", [1], True])}, rng), 1007)
    if kind == "payload":
        return Probe(
            json_text({**media, "media": {"payload": rng.choice([None, 5, [], {"b": 1}])}}, rng), 1007
        )
    if kind == "base64":
        payload = rng.choice(
            ["%%%", "abc", "A", "=AAA", "AAAA=", "AA AA", "AAA\n", "é" * 4, random_text(rng, 20) + "*"]
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
        message["start"]["mediaFormat"]["sampleRate"] = absurd_rate(rng)
        rate = message["start"]["mediaFormat"]["sampleRate"]
        return Probe(json.dumps(message, allow_nan=True), None if rate == 8000 else 4415)
    if kind == 1:
        message["start"]["mediaFormat"] = rng.choice([None, "audio/x-mulaw", [8000], 8000])
        return Probe(json.dumps(message), 1007)
    if kind == 2:
        message["start"]["mediaFormat"] = {
            **TWILIO_FORMAT,
            rng.choice(["encoding", "channels"]): random_scalar(rng),
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
