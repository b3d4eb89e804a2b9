"""The fuzz targets' entry points: `python -m tests.support.fuzzing.targets gateway|engine --port P` serves
the gateway on fakes, or the engine server on a tiny random engine, logging every ERROR."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence

from tests.support.fuzzing.engine_server import ENGINE_KEY, ENGINE_MODEL


class FuzzTokenizer:
    """A tokenizer for a tiny random engine behind the HTTP API: each character is one id, and a chat
    template that joins the messages. Decodes like tests.fakes.FakeTokenizer."""

    eos_token_id = 0
    chat_template = "role: content"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1 + ord(c) % (self.vocab_size - 1) for c in text]

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True, tokenize: bool = True
    ) -> list[int]:
        return self.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if i == 0 and skip_special_tokens else f" w{i}" for i in token_ids)


def _serve_gateway(port: int, settings: dict[str, str]) -> None:
    import uvicorn

    from tests.fakes import FakePipeline
    from voiceagent.config import Settings
    from voiceagent.gateway.app import build_app
    from voiceagent.gateway.serve import uvicorn_config
    from voiceagent.gateway.webrtc import routes

    app = build_app(FakePipeline(word_ms=20), Settings(**settings), routes())  # type: ignore[arg-type]
    config = uvicorn_config(app, app.state.hub.settings, "127.0.0.1", port)
    config.log_level = "info"
    _log_everything()
    uvicorn.Server(config).run()


def _serve_engine(port: int, settings: dict[str, str]) -> None:
    import uvicorn

    from engine.server.app import ServerConfig, build_app
    from engine.server.http_deadline import HeadersDeadline
    from tests.fakes import TINY_VOCAB, tiny_engine

    engine = tiny_engine(max_seq_len=512)
    engine.tokenizer = FuzzTokenizer(TINY_VOCAB)
    values = {name: json.loads(value) for name, value in settings.items()}  # numbers: body_timeout_s=5
    config = ServerConfig(model_name=ENGINE_MODEL, api_key=ENGINE_KEY, max_queue_len=64, **values)
    app = build_app(engine, config)
    uvicorn_config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="info", access_log=False, http=HeadersDeadline
    )
    _log_everything()
    uvicorn.Server(uvicorn_config).run()


def _log_everything() -> None:
    """Every logger at INFO with its level on each line, so an ERROR anywhere shows in the log."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)
    for name in ("uvicorn", "uvicorn.error", "voiceagent", "engine"):
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a fuzz target: the gateway on fakes, or the engine server")
    parser.add_argument("kind", choices=["gateway", "engine"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--set", action="append", default=[], help="a setting, NAME=VALUE")
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    (_serve_gateway if args.kind == "gateway" else _serve_engine)(args.port, settings)


if __name__ == "__main__":
    main()
