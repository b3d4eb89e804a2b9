"""1,000 abrupt disconnects at random points of a turn, and what the gateway holds afterwards.

    .venv/bin/python -m bench.disconnects [--drops 1000] [--concurrency 25] [--warm-up 100] [--seed 8]

The gateway runs in this process on tests/gateway/drops.py's pipeline (fake ears and voice around a real
tiny engine behind LocalLLM), with traces and input-audio recording on (so every session opens files).
Callers on /ws and /twilio speak and drop the TCP connection without a close frame (FIN or RST) while
speaking, while the agent thinks, or while its audio plays. After a warm-up batch the baseline is taken;
after every 100 drops the process is measured again once the sessions have closed (tasks, threads, fds,
resident memory), and at the end a fresh session must get a whole reply from the engine.

Progress goes to stderr; the LAST line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.gateway import (
    DropPipeline,
    DropResult,
    Resources,
    drop_many,
    gauges,
    one_full_turn,
    random_plans,
    running,
    settle,
    tally,
)
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app

CHECK_EVERY = 100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def run(drops: int, concurrency: int, warm_up: int, seed: int, trace_dir: Path) -> dict[str, Any]:
    pipeline = DropPipeline()
    app = build_app(pipeline, Settings(max_sessions=concurrency + 8, trace_dir=trace_dir, record_audio=True))
    hub, rng = app.state.hub, random.Random(seed)
    async with running(app) as host:
        await drop_many(host, random_plans(warm_up, rng), concurrency)
        baseline = await settle(hub, pipeline.engine)
        log(f"baseline after {warm_up} warm-up drops: {baseline.fds} fds, {baseline.rss / 2**20:.1f} MiB "
            f"resident after malloc_trim ({baseline.raw_rss / 2**20:.1f} before)")  # fmt: skip
        results: list[DropResult] = []
        checks = []
        started = time.perf_counter()
        while len(results) < drops:
            batch = random_plans(min(CHECK_EVERY, drops - len(results)), rng)
            results += await drop_many(host, batch, concurrency)
            now = await settle(hub, pipeline.engine, baseline=baseline)
            leaks = now.leaks_since(baseline)
            checks.append(_check(len(results), now, leaks))
            log(f"{len(results):5d} drops ({time.perf_counter() - started:.0f} s): fds {now.fds} (baseline "
                f"{baseline.fds}), rss {now.rss / 2**20:.1f} MiB ({100 * leaks['rss_growth']:+.2f}%; before "
                f"malloc_trim {100 * leaks['raw_rss_growth']:+.2f}%), leaked tasks {len(leaks['tasks'])} "
                f"threads {len(leaks['threads'])}, live sessions {len(hub.live)}")  # fmt: skip
        elapsed = time.perf_counter() - started
        lock = pipeline.engine.lock
        final = now.leaks_since(baseline)
        turn = await one_full_turn(host)
    return {
        "drops": len(results),
        "by_transport_and_point": tally(results),
        "resets": sum(r.plan.reset for r in results),
        "concurrency": concurrency,
        "seconds": round(elapsed, 1),
        "baseline": {
            "fds": baseline.fds,
            "rss_mib": round(baseline.rss / 2**20, 1),
            "raw_rss_mib": round(baseline.raw_rss / 2**20, 1),
            "warm_up_drops": warm_up,
        },
        "after": {
            "fds": now.fds,
            "rss_mib": round(now.rss / 2**20, 1),
            "rss_growth_pct": round(100 * final["rss_growth"], 2),
            "raw_rss_growth_pct": round(100 * final["raw_rss_growth"], 2),
            "tasks_leaked": final["tasks"],
            "threads_leaked": final["threads"],
            "live_sessions": len(hub.live),
            "sessions_active_gauges": gauges(hub),
            "engine_lock_held": lock.locked(),
        },  # fmt: skip
        "checks": checks,
        "next_turn": {
            "outcome": turn["metrics"]["outcome"],
            "reply_words": len(turn["reply"].split()),
            "voice_to_voice_ms": turn["metrics"]["latency_ms"]["voice_to_voice"],
        },  # fmt: skip
    }


def _check(drops: int, now: Resources, leaks: dict[str, Any]) -> dict[str, Any]:
    return {"drops": drops, "fds": now.fds, "rss_mib": round(now.rss / 2**20, 1),
            "rss_growth_pct": round(100 * leaks["rss_growth"], 2),
            "raw_rss_mib": round(now.raw_rss / 2**20, 1),
            "raw_rss_growth_pct": round(100 * leaks["raw_rss_growth"], 2),
            "tasks_leaked": len(leaks["tasks"]), "threads_leaked": len(leaks["threads"])}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drops", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=25)
    parser.add_argument("--warm-up", type=int, default=100)
    parser.add_argument("--seed", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="disconnects-") as traces:
        summary = asyncio.run(run(args.drops, args.concurrency, args.warm_up, args.seed, Path(traces)))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
