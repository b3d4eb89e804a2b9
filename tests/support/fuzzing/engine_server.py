"""The engine server (/v1/*) as a fuzz target: malformed and mutated OpenAI requests, never a 5xx, bad
ones a 4xx error object (the rules of engine/server/protocol.py); and a healthy client beside them."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any
from urllib.parse import quote

import httpx

from tests.support.fuzzing.tally import Plan, Progress, Tally, TurnTimes
from tests.support.fuzzing.values import (
    json_or_none,
    json_text,
    not_json,
    random_json,
    random_scalar,
    random_text,
)

ENGINE_MODEL = "tiny"


ENGINE_KEY = "engine-fuzz-key"


AUTH = {"Authorization": f"Bearer {ENGINE_KEY}"}


def _chat_request(rng: random.Random) -> dict[str, Any]:
    messages = [
        {"role": rng.choice(["system", "user", "assistant", "developer"]), "content": random_text(rng, 30)}
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
                random_scalar(rng),
                random_json(rng, 2),
                [random_text(rng, 5)] * rng.randint(0, 20),
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
        return "POST", chat, AUTH, json_text(body, rng).encode(), {200} | client_error
    if kind == "not_json":
        return "POST", rng.choice([chat, "/v1/completions"]), AUTH, not_json(rng, 65536).encode(), {400}
    if kind == "value":
        return (
            "POST",
            chat,
            AUTH,
            json_text(rng.choice([[], 5, "x", None, [{"model": "tiny"}]]), rng).encode(),
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
                ("GET", "/" + quote(random_text(rng, 10))),
            ]
        )
        return method, path, AUTH, b"", {404, 405, 400}
    if kind == "completion":
        prompt = rng.choice(
            [
                random_text(rng, 20) or "a",
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
            error = (json_or_none(response) or {}).get("error")
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


async def fuzz_engine(host: str, plan: Plan, tally: Tally, progress: Progress) -> None:
    rng = random.Random(plan.seed + 1)
    async with httpx.AsyncClient(base_url=f"http://{host}", timeout=60) as http:
        batch = 200
        for start in range(0, plan.shares["engine"], batch):
            await run_engine_probes(http, rng, min(batch, plan.shares["engine"] - start), tally)
            progress(tally)


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
