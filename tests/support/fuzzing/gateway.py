"""The gateway as a fuzz target: /ws and /twilio scripts and POST /webrtc/offer bodies and mutated SDP
offers (each must get a JSON answer or a 4xx/503 JSON error), `plan.parallel` connections at a time;
connections refused before any message; and a healthy /ws session beside the fuzzing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from tests.support.fuzzing.tally import Plan, Progress, Tally, TurnTimes
from tests.support.fuzzing.twilio import run_twilio_script, twilio_script
from tests.support.fuzzing.values import json_or_none, json_text, not_json, random_json, random_text
from tests.support.fuzzing.ws import run_ws_script, ws_script


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
            lines[i] = lines[i][:2] + random_text(rng, 30)
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
        return json_text(random_json(rng), rng).encode(), {400}
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
        answer = json_or_none(response)
        if response.status_code not in allowed or not isinstance(answer, dict):
            tally.mismatch("webrtc", f"{body[:60]!r}: {response.status_code} {response.text[:100]}")
        elif response.status_code == 200:
            if answer.get("type") != "answer":
                tally.mismatch("webrtc", f"200 without an answer: {response.text[:100]}")
        elif answer.get("type") == "error" and answer.get("message"):
            tally.answered["webrtc"] += bad
        else:
            tally.mismatch("webrtc", f"{response.status_code} without an error object: {response.text[:100]}")


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
