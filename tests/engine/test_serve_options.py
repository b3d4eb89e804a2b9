"""`python -m engine serve` flags: vLLM's spellings resolve to one engine configuration; bad ones fail."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import httpx
import pytest

from engine.bundled import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.cli import _parser
from engine.server.cli import ServeOptions, serve_options
from engine.server.protocol import APIError, ChatCompletionRequest, parse_request
from tests.support.servers import free_port

MODEL = "smollm2-135m-instruct"


def options(*flags: str) -> ServeOptions:
    return serve_options(_parser().parse_args(["serve", *flags]))


def test_defaults_are_the_bundled_pair() -> None:
    assert options() == ServeOptions(DEFAULT_TARGET, DEFAULT_DRAFT, 4, "bf16", DEFAULT_TARGET)


def test_the_seeds_vllm_flags() -> None:
    resolved = options(
        "--model", "a", "--speculative-model", "b", "--num-speculative-tokens", "5", "--dtype", "float16",
        "--served-model-name", "llama",
    )  # fmt: skip
    assert resolved == ServeOptions("a", "b", 5, "fp16", "llama")


def test_positional_model_as_vllm_serve_takes_it() -> None:
    assert options(MODEL).target == MODEL
    with pytest.raises(ValueError, match="the model is given twice"):
        options(MODEL, "--model", "other")


def test_num_speculative_tokens_auto_and_plain_decoding() -> None:
    assert options("--num-speculative-tokens", "auto").gamma == "auto"
    assert options("--speculative-model", "none").draft is None


def test_newer_vllm_speculative_config() -> None:
    config = '{"model": "draft-x", "num_speculative_tokens": 3, "method": "draft_model"}'
    resolved = options("--speculative-config", config, "--speculative-model", "ignored")
    assert (resolved.draft, resolved.gamma) == ("draft-x", 3)
    assert options("--speculative-config", '{"model": "d", "num_speculative_tokens": "auto"}').gamma == "auto"


def test_weight_quantization_of_target_and_draft() -> None:
    resolved = options("--quantization", "int8", "--speculative-model-quantization", "int4")
    assert (resolved.quant, resolved.draft_quant) == ("int8", "int4")
    assert options("--speculative-config", '{"model": "d", "quantization": "int4"}').draft_quant == "int4"
    with pytest.raises(ValueError, match="quantization: choose one of none, int8, int4.*got 'int3'"):
        options("--speculative-config", '{"model": "d", "quantization": "int3"}')


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"method": "ngram", "model": "x"}', "only method 'draft_model'"),
        ('{"num_speculative_tokens": 3}', "needs a 'model'"),
        ('{"model": "x", "num_speculative_tokens": -1}', "must be >= 0"),
        ('{"model": "x", "draft_tensor_parallel_size": 2}', "unsupported keys"),
    ],
)
def test_speculative_config_refused(config: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        options("--speculative-config", config)


@pytest.mark.parametrize(
    "flags",
    [
        ["--num-speculative-tokens", "many"],
        ["--num-speculative-tokens", "-2"],
        ["--speculative-config", "{not json"],
        ["--speculative-config", "[1]"],
        ["--dtype", "int3"],
    ],
)
def test_bad_flags_exit_with_usage(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["serve", *flags])
    assert exit_info.value.code == 2
    assert "serve" in capsys.readouterr().err


def test_unknown_model_stops_the_server_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "engine", "serve", "--model", "no-such-model", "--port", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown model 'no-such-model'" in result.stderr


def test_request_parsing_names_the_nested_parameter() -> None:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    with pytest.raises(APIError) as error:
        parse_request(httpx.Request("POST", "/", json=body).read(), ChatCompletionRequest)
    assert error.value.status == 400 and error.value.param is not None
    assert error.value.param.startswith("messages[0].content")
    text_parts = {
        "model": "m",
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}]}],
    }
    parsed = parse_request(httpx.Request("POST", "/", json=text_parts).read(), ChatCompletionRequest)
    assert parsed.messages[0].as_template_message() == {"role": "system", "content": "a"}


@pytest.mark.bundled
def test_a_server_with_adaptive_speculation_length() -> None:
    """`--num-speculative-tokens auto` reaches the engine as gamma="auto" and the server streams with it.

    SmolLM2 drafting for itself costs a target step per drafted token, so the calibrated adaptive length
    rightly never drafts here: the test checks that auto is in force, not that it drafts.
    """
    from engine.load import load_engine
    from engine.server.app import ServerConfig, ServerThread, build_app

    resolved = options("--model", MODEL, "--speculative-model", MODEL, "--num-speculative-tokens", "auto")
    engine = load_engine(resolved.target, resolved.draft, max_seq_len=256, gamma=resolved.gamma)
    assert engine.gamma == "auto" and engine.speculation.calibrated  # auto, with costs timed at load
    port = free_port()
    with ServerThread(build_app(engine, ServerConfig(model_name=MODEL)), port=port) as server:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 16,
            "temperature": 0,
        }
        response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60.0)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] > 0
        metrics = httpx.get(server.url + "/metrics").text
    assert 'vllm:spec_decode_num_drafts_total{engine="0",model_name="' in metrics


def test_argparse_namespace_round_trip() -> None:
    namespace = _parser().parse_args(["serve", "--port", "9000", "--max-queue-len", "3", "--api-key", "k"])
    assert isinstance(namespace, argparse.Namespace)
    assert (namespace.port, namespace.max_queue_len, namespace.api_key) == (9000, 3, "k")
