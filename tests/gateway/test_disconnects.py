"""Abrupt disconnects (TCP closed without a close frame) at random points of turns on /ws and /twilio leave
nothing behind: no task, thread, file descriptor or session, gauges at 0, memory flat, and the engine (a
real tiny one behind LocalLLM) serves the next session's turn. bench/disconnects.py runs 1,000 of them."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from tests.gateway.drops import (
    PHASES,
    TRANSPORTS,
    DropPipeline,
    drop_many,
    gauges,
    one_full_turn,
    random_plans,
    settle,
    tally,
)
from tests.gateway.helpers import running
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app


def test_random_abrupt_disconnects_leak_nothing_and_the_engine_serves_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        pipeline = DropPipeline()
        settings = Settings(max_sessions=64, trace_dir=tmp_path, record_audio=True)
        app = build_app(pipeline, settings)
        hub, rng = app.state.hub, random.Random(8)
        async with running(app) as host:
            await drop_many(host, random_plans(50, rng), concurrency=25)  # warm-up: pools, caches, arenas
            baseline = await settle(hub, pipeline.engine)
            results = await drop_many(host, random_plans(150, rng), concurrency=25)
            after = await settle(hub, pipeline.engine, baseline=baseline)
            leaks = after.leaks_since(baseline)
            assert leaks["tasks"] == [] and leaks["threads"] == [], leaks
            assert leaks["extra_fds"] <= 0, leaks
            assert leaks["rss_growth"] < 0.05, leaks
            assert not hub.live and gauges(hub) == {t: 0.0 for t in TRANSPORTS}
            lock = pipeline.engine.lock
            assert not lock.locked() and lock.waiting() == 0
            # drops landed in every phase, on both transports
            counts = tally(results)
            for transport in TRANSPORTS:
                for seen in ("speaking", "thinking", "agent_audio"):
                    assert counts.get(f"{transport}/{seen}", 0) >= 5, counts
            assert {r.plan.phase for r in results} == set(PHASES)
            turn = await one_full_turn(host)
            assert turn["metrics"]["outcome"] == "done", turn
            assert len(turn["reply"].split()) == pipeline.reply_tokens and turn["close_code"] == 1000

    asyncio.run(scenario())
