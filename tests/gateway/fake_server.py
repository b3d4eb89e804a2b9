"""The gateway on fake stages as a process of its own, for tests and benchmarks that need a real server to
kill or to load from other processes:

    python -m tests.gateway.fake_server --port P [--words 20] [--word-ms 100] [--llm-delay-s 0]

It serves `build_app(FakePipeline(...), Settings())` under uvicorn on 127.0.0.1 (settings from the
VOICEAGENT_* environment: VOICEAGENT_TRACE_DIR, VOICEAGENT_RECORD_AUDIO, VOICEAGENT_MAX_SESSIONS, ...).
Every session hears "hello there" and answers `--words` words, each spoken as `--word-ms` of tone (one
phrase a word, or phrases from the pipeline's PhraseChunker with `--chunker phrase`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import signal
import sys
from collections.abc import Iterator
from typing import Any

import uvicorn

from tests.fakes import FakePipeline
from voiceagent.chunker import PhraseChunker
from voiceagent.config import Settings
from voiceagent.gateway.app import build_app
from voiceagent.gateway.serve import uvicorn_config


def reply_words(n: int) -> tuple[str, ...]:
    return tuple(f"{' ' if i else ''}word{i}" for i in range(n))


class PhrasePipeline(FakePipeline):
    """FakePipeline with the pipeline's own PhraseChunker: replies are spoken a phrase (~4 words) at a time,
    as with a real voice, rather than a word at a time (each phrase costs worker-thread hops)."""

    def new_session(self, clock: Any, trace: Any, options: Any = None) -> Any:
        session = super().new_session(clock, trace, options)
        session.replier.new_chunker = PhraseChunker
        self.sessions.clear()  # a load run makes many: keep none
        return session


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the gateway on fake stages")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--words", type=int, default=20, help="words in every reply")
    parser.add_argument("--word-ms", type=int, default=100, help="audio per word")
    parser.add_argument("--llm-delay-s", type=float, default=0.0, help="the fake LLM's wait per block")
    parser.add_argument(
        "--chunker", choices=("word", "phrase"), default="word", help="one phrase a word, or the real chunker"
    )
    parser.add_argument("--profile", help="write cProfile statistics here when the server stops (SIGTERM)")
    parser.add_argument("--switch-interval-ms", type=float, help="sys.setswitchinterval (GIL hand-over)")
    args = parser.parse_args(argv)
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    settings = Settings()
    pipeline = FakePipeline(reply_words(args.words), word_ms=args.word_ms, llm_delay_s=args.llm_delay_s)
    if args.chunker == "phrase":
        pipeline = PhrasePipeline(reply_words(args.words), word_ms=args.word_ms, llm_delay_s=args.llm_delay_s)
    app = build_app(pipeline, settings)
    server = uvicorn.Server(uvicorn_config(app, settings, "127.0.0.1", args.port))
    print(f"fake gateway on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    if args.profile is None:
        asyncio.run(server.serve())
        return
    server.capture_signals = lambda: _stop_on_signals(server)  # type: ignore[method-assign]
    with cProfile.Profile() as profile:
        asyncio.run(server.serve())
    profile.dump_stats(args.profile)


@contextlib.contextmanager
def _stop_on_signals(server: uvicorn.Server) -> Iterator[None]:
    """SIGTERM/SIGINT stop the server and return (uvicorn would re-raise them: no profile written)."""

    def stop(*_: object) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    main()
