"""Hostile JSON-ish values every target gets: random text and scalars, any JSON value, JSON with NaN
spelled out, nesting deep enough to break a recursive parser, text that is not JSON; and `Probe`, one
message with the answer the protocol says it must get."""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Probe:
    """One message and what must come back: an error code (/ws), a close code (/twilio), or None (none)."""

    payload: str | bytes
    expect: Any = None


def random_text(rng: random.Random, longest: int = 40) -> str:
    """Random text: ASCII, control characters, and other planes (no lone surrogates: not UTF-8)."""
    alphabet = rng.choice(
        [string.printable, string.ascii_letters, '\x00\x01\x1b\t\n"\\{}[]:,', "éü中文😀\u200b\ufeff\u202e"]
    )
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, longest)))


def random_scalar(rng: random.Random) -> Any:
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
            random_text(rng),
            "16000",
            "pcm16",
            "session.start",
        ]
    )


def random_json(rng: random.Random, depth: int = 3) -> Any:
    """Any JSON value, a few levels deep."""
    if depth <= 0 or rng.random() < 0.5:
        return random_scalar(rng)
    if rng.random() < 0.5:
        return [random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return {random_text(rng, 8): random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))}


def json_text(value: Any, rng: random.Random) -> str:
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
        return "x" + random_text(rng, 200)
    if choice == 4:
        return "{" + random_text(rng, 60)
    huge_int = '{"type": "session.start", "version": ' + "9" * rng.randint(4301, 9000) + "}"
    return rng.choice(
        ["nan", "undefined", "{'type': 'session.start'}", "\x00", "\ufeff{}", "{}}", "[1,]", huge_int]
    )


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def absurd_rate(rng: random.Random) -> Any:
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
