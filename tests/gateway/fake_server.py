"""The gateway on fake stages as a process of its own, for tests and benchmarks that need a real server to
kill or to load from other processes:

    python -m tests.gateway.fake_server --port P [--words 20] [--word-ms 100] [--llm-delay-s 0]

It serves `build_app(FakePipeline(...), Settings())` under uvicorn on 127.0.0.1 (settings from the
VOICEAGENT_* environment: VOICEAGENT_TRACE_DIR, VOICEAGENT_RECORD_AUDIO, VOICEAGENT_MAX_SESSIONS, ...).
Every session hears "hello there" and answers `--words` words, each spoken as `--word-ms` of tone.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import uvicorn

from tests.fakes import FakePipeline
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app
from voiceagent.gateway.serve import uvicorn_config


def reply_words(n: int) -> tuple[str, ...]:
    return tuple(f"{' ' if i else ''}word{i}" for i in range(n))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the gateway on fake stages")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--words", type=int, default=20, help="words in every reply")
    parser.add_argument("--word-ms", type=int, default=100, help="audio per word")
    parser.add_argument("--llm-delay-s", type=float, default=0.0, help="the fake LLM's wait per block")
    args = parser.parse_args(argv)
    settings = Settings()
    pipeline = FakePipeline(reply_words(args.words), word_ms=args.word_ms, llm_delay_s=args.llm_delay_s)
    app = build_app(pipeline, settings)
    server = uvicorn.Server(uvicorn_config(app, settings, "127.0.0.1", args.port))
    print(f"fake gateway on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    asyncio.run(server.serve())


if __name__ == "__main__":
    main()
