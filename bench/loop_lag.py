"""How late a voice session's event loop wakes while the engine decodes beside it.

A session's audio frames, VAD, endpointing and traces run on one asyncio loop, and the engine computes on
its own thread (engine/engine_thread.py). Whatever the engine's calls hold Python's lock for, the loop
waits. This times 20 ms sleeps on the loop (each wake does a little Python work, as a frame's handling
does) while the engine decodes a long reply with the voice agent's models, then with the engine idle:

    python -m bench.loop_lag [--seconds 8] [--rounds 2]

It prints the lateness of the wakes (p50, p95, max, in ms) per round; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from engine import Engine, SamplingParams
from engine.bench.cpu_backends import cpu_description
from engine.engine_thread import ENGINE_THREAD
from engine.load import chat_prompt
from voiceagent.config import Settings
from voiceagent.llm import load_local_engine

WAKE_S = 0.02  # an audio frame's period
STORY = "Write a long story about a dragon and a knight."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each round wakes the loop")
    parser.add_argument("--rounds", type=int, default=2, help="rounds while decoding, then one idle")
    return parser.parse_args(argv)


def decode(engine: Engine, seconds: float) -> int:
    """On the engine thread: plain decoding of a long reply for about `seconds`; returns its tokens."""
    prompt = chat_prompt(engine.tokenizer, [{"role": "user", "content": STORY}])
    ends, n_tokens = time.perf_counter() + seconds, 0
    while time.perf_counter() < ends:
        blocks = engine.new_conversation().generate(prompt, SamplingParams(max_new_tokens=256))
        for block in blocks:
            n_tokens += len(block.token_ids)
            if time.perf_counter() >= ends:
                blocks.close()  # the generation ends here, and its conversation is free
                break
    return n_tokens


async def lateness(engine: Engine, seconds: float, busy: bool) -> dict[str, Any]:
    """The loop's wakes over `seconds`, with the engine decoding (`busy`) or idle."""
    job = asyncio.wrap_future(ENGINE_THREAD.submit(decode, engine, seconds)) if busy else None
    late_ms: list[float] = []
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        asked = time.perf_counter()
        await asyncio.sleep(WAKE_S)
        late_ms.append((time.perf_counter() - asked - WAKE_S) * 1e3)
        sum(i * i for i in range(2000))  # a frame's worth of Python work
    n_tokens = await job if job is not None else 0
    late_ms.sort()
    return {
        "engine": "decoding" if busy else "idle",
        "tokens": n_tokens,
        "late_ms_p50": round(statistics.median(late_ms), 2),
        "late_ms_p95": round(late_ms[int(0.95 * len(late_ms))], 2),
        "late_ms_max": round(late_ms[-1], 2),
        "wakes": len(late_ms),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = ENGINE_THREAD.submit(load_local_engine, Settings()).result()
    rounds = [asyncio.run(lateness(engine, args.seconds, busy=True)) for _ in range(args.rounds)]
    rounds.append(asyncio.run(lateness(engine, args.seconds, busy=False)))
    for row in rounds:
        print(
            f"engine {row['engine']:8s}: wakes late by {row['late_ms_p50']:6.2f} ms p50, "
            f"{row['late_ms_p95']:6.2f} p95, {row['late_ms_max']:6.2f} max ({row['wakes']} wakes, "
            f"{row['tokens']} tokens decoded)",
            flush=True,
        )
    print(json.dumps({"cpu": cpu_description(), "rounds": rounds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
