"""How many concurrent conversations the real bundled models serve with voice-to-voice p95 under 2 s.

    .venv/bin/python -m bench.concurrent_voice [--levels 1,2,3,4] [--turns 3]

Loads the default pipeline once (`Pipeline.load(Settings())`, ~60 s, ~7 GB), serves it on a loopback port,
and for each level N runs N `/ws` clients at once. Each client speaks `--turns` questions (espeak-ng, from
bench/voice_questions.txt) at real pace, sends silence like an open microphone while the agent answers, and
waits for the turn's `turn.metrics`; clients start 0.7 s apart so their turns are not in lockstep. The one
engine is batch-1: conversations queue for it block by block (FIFO, `engine.fair_lock.FairLock`).

Progress goes to stderr; the LAST line on stdout is one JSON object: per level the voice-to-voice
p50/p95/max (ms, from `turn.metrics`), the outcomes, and the largest N whose p95 stayed under 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.audio import espeak_speech, silence
from tests.support.gateway import Client, client, running
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app
from voiceagent.replay.stats import latency_summary

QUESTIONS = Path("bench/voice_questions.txt")
GOAL_MS = 2000.0
STAGGER_S = 0.7
FRAME = 320  # 20 ms at 16 kHz


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def converse(host: str, clips: list[np.ndarray], delay_s: float) -> list[dict[str, Any]]:
    """One conversation: each clip spoken at real pace, silence sent while the agent answers; returns the
    `turn.metrics` of each turn."""
    await asyncio.sleep(delay_s)
    async with client(host) as c:
        await c.send_json({"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}})
        await c.event("session.started")
        results = []
        for clip in clips:
            seen = len(c.events)
            await c.stream(clip, 16000)
            results.append(await _metrics_while_silent(c, seen))
        await c.send_json({"type": "session.end"})
        return results


async def _metrics_while_silent(c: Client, after: int, timeout_s: float = 90.0) -> dict[str, Any]:
    """Sends 20 ms of silence at real pace until a `turn.metrics` event arrives after index `after`."""
    quiet = np.zeros(FRAME, dtype="<i2").tobytes()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in c.events[after:]:
            if event["type"] == "turn.metrics":
                return event
        if c.closed is not None:
            raise RuntimeError(f"the server closed the session: {c.closed}")
        await c.ws.send(quiet)
        await asyncio.sleep(0.02)
    raise TimeoutError("no turn.metrics within 90 s")


def _latencies(metrics: list[dict[str, Any]], stage: str) -> list[float]:
    return [m["latency_ms"][stage] for m in metrics if m["latency_ms"][stage] is not None]


async def run_level(host: str, n: int, clips: list[np.ndarray], turns: int) -> dict[str, Any]:
    plans = [[clips[(i * turns + t) % len(clips)] for t in range(turns)] for i in range(n)]
    started = time.perf_counter()
    talks = [converse(host, plan, i * STAGGER_S) for i, plan in enumerate(plans)]
    metrics = [m for conversation in await asyncio.gather(*talks) for m in conversation]
    v2v = _latencies(metrics, "voice_to_voice")
    first_block = _latencies(metrics, "first_block")
    outcomes: dict[str, int] = {}
    for m in metrics:
        outcomes[m["outcome"]] = outcomes.get(m["outcome"], 0) + 1
    return {
        "concurrent": n,
        "turns": len(metrics),
        "outcomes": outcomes,
        "voice_to_voice_ms": latency_summary(v2v),
        "first_block_ms": latency_summary(first_block),
        "seconds": round(time.perf_counter() - started, 1),
    }


async def main_async(levels: list[int], turns: int) -> dict[str, Any]:
    from voiceagent.pipeline import Pipeline

    settings = Settings(max_sessions=max(levels) + 1)
    started = time.perf_counter()
    pipeline = await asyncio.to_thread(Pipeline.load, settings, log)
    await pipeline.warm_up()
    load_s = time.perf_counter() - started
    log(f"models loaded and warmed in {load_s:.0f} s")
    questions = [q.strip() for q in QUESTIONS.read_text().splitlines() if q.strip()]  # noqa: ASYNC240
    with tempfile.TemporaryDirectory(prefix="concurrent-voice-") as scratch:
        clips = [
            np.concatenate([silence(1.0), espeak_speech(q, scratch), silence(1.5)]).astype(np.int16)
            for q in questions[: max(levels) * turns]
        ]
    rows = []
    async with running(build_app(pipeline, settings)) as host:
        for n in levels:
            row = await run_level(host, n, clips, turns)
            figures = row["voice_to_voice_ms"]
            log(f"N={n}: voice_to_voice p50 {figures['p50']} p95 {figures['p95']} max {figures['max']} ms "
                f"over {row['turns']} turns {row['outcomes']} ({row['seconds']} s)")  # fmt: skip
            rows.append(row)
    under = [r["concurrent"] for r in rows if (r["voice_to_voice_ms"]["p95"] or 1e9) < GOAL_MS]
    return {
        "levels": rows,
        "goal_p95_ms": GOAL_MS,
        "max_concurrent_under_goal": max(under, default=0),
        "load_and_warm_s": round(load_s, 1),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "models": {"target": settings.target, "draft": settings.draft, "asr": settings.asr_model},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", default="1,2,3,4", help="concurrent conversations, comma-separated")
    parser.add_argument("--turns", type=int, default=3, help="questions per conversation")
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    print(json.dumps(asyncio.run(main_async(levels, args.turns))))


if __name__ == "__main__":
    main()
