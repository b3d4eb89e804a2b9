"""The engine server under bad input, without its key, over capacity, and when clients leave: raw HTTP.

The server runs in this process (one SmolLM2 engine, a 1024-token context, an API key, a queue of one).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.load import load_engine
from engine.server.app import ServerConfig, ServerThread, build_app
from tests.support.servers import free_port

pytestmark = pytest.mark.bundled

MODEL = "smollm2-135m-instruct"
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    engine = load_engine(MODEL, MODEL, max_seq_len=1024)
    app = build_app(
        engine, ServerConfig(model_name="smol", api_key=KEY, max_queue_len=1, num_speculative_tokens=4)
    )
    port = free_port()
    with ServerThread(app, port=port) as server:
        yield server.url


def post(
    url: str, path: str, body: Any, headers: dict[str, str] = AUTH, timeout: float = 60.0
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**headers, "Content-Type": "application/json"}
    return httpx.post(url + path, content=content, headers=headers, timeout=timeout)


def metric(url: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {name} {labels}")


def assert_error(
    response: httpx.Response, status: int, param: str | None, code: str | None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["param"] == param and error["code"] == code, error
    return error


CHAT = {"model": "smol", "messages": HELLO, "max_tokens": 4}
BAD_CHAT = [
    (b'{"model": "smol", "messages": [', 400, None, None),
    (b"[1, 2, 3]", 400, None, None),
    ({**CHAT, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ({"model": "smol"}, 400, "messages", "missing_required_parameter"),
    ({**CHAT, "messages": []}, 400, "messages", "invalid_value"),
    ({**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", "invalid_value"),
    ({**CHAT, "messages": [{"role": "user"}]}, 400, "messages[0].content", "missing_required_parameter"),
    ({**CHAT, "max_tokens": 100_000}, 400, "max_tokens", "context_length_exceeded"),
    ({**CHAT, "max_completion_tokens": 100_000}, 400, "max_completion_tokens", "context_length_exceeded"),
    ({**CHAT, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    (
        {**CHAT, "messages": [{"role": "user", "content": "word " * 1100}]},
        400,
        "messages",
        "context_length_exceeded",
    ),
    ({**CHAT, "temperature": -1}, 400, "temperature", "invalid_value"),
    ({**CHAT, "temperature": 2.5}, 400, "temperature", "invalid_value"),
    ({**CHAT, "temperature": "hot"}, 400, "temperature", "invalid_value"),
    ({**CHAT, "top_p": 0}, 400, "top_p", "invalid_value"),
    ({**CHAT, "top_k": -2}, 400, "top_k", "invalid_value"),
    ({**CHAT, "seed": "seven"}, 400, "seed", "invalid_value"),
    ({**CHAT, "stop": [""]}, 400, "stop", "unsupported_parameter"),
    ({**CHAT, "stop": 5}, 400, "stop", "invalid_value"),
    ({**CHAT, "n": 2}, 400, "n", "unsupported_parameter"),
    ({**CHAT, "presence_penalty": 0.5}, 400, "presence_penalty", "unsupported_parameter"),
    ({**CHAT, "logprobs": True}, 400, "logprobs", "unsupported_parameter"),
    ({**CHAT, "stream_options": {"include_usage": True}}, 400, "stream_options", "unsupported_parameter"),
]


@pytest.mark.parametrize(("body", "status", "param", "code"), BAD_CHAT)
def test_bad_chat_requests(url: str, body: Any, status: int, param: str | None, code: str | None) -> None:
    assert_error(post(url, "/v1/chat/completions", body), status, param, code)


BAD_COMPLETIONS = [
    ({"model": "smol", "prompt": ""}, 400, "prompt", "invalid_value"),
    ({"model": "smol", "prompt": [1, 2, 10**9]}, 400, "prompt", "invalid_value"),
    ({"model": "smol", "prompt": ["a", "b"]}, 400, "prompt", "unsupported_parameter"),
    ({"model": "smol", "prompt": "hi", "echo": True}, 400, "echo", "unsupported_parameter"),
    ({"model": "smol", "prompt": list(range(1, 1100))}, 400, "prompt", "context_length_exceeded"),
]


@pytest.mark.parametrize(("body", "status", "param", "code"), BAD_COMPLETIONS)
def test_bad_completion_requests(
    url: str, body: Any, status: int, param: str | None, code: str | None
) -> None:
    assert_error(post(url, "/v1/completions", body), status, param, code)


def test_the_server_still_answers_after_bad_input(url: str) -> None:
    response = post(url, "/v1/chat/completions", CHAT)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 4


def test_api_key_required_on_the_api_only(url: str) -> None:
    assert_error(post(url, "/v1/chat/completions", CHAT, headers={}), 401, None, "invalid_api_key")
    wrong = {"Authorization": "Bearer nope"}
    assert_error(post(url, "/v1/chat/completions", CHAT, headers=wrong), 401, None, "invalid_api_key")
    assert_error(httpx.get(url + "/v1/models", headers={"Authorization": KEY}), 401, None, "invalid_api_key")
    assert httpx.get(url + "/v1/models", headers=AUTH).json()["data"][0]["id"] == "smol"
    assert httpx.get(url + "/health").status_code == 200  # probes and scrapers need no key, as in vLLM
    assert httpx.get(url + "/metrics").status_code == 200


def test_unknown_route_and_method(url: str) -> None:
    assert_error(httpx.get(url + "/v1/nothing-here", headers=AUTH), 404, None, None)
    assert_error(httpx.get(url + "/v1/chat/completions", headers=AUTH), 405, None, None)


def wait_for(condition: Any, timeout_s: float = 10.0) -> float:
    """Polls `condition` until true; returns the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.05)
    return time.monotonic() - start


def test_full_queue_is_429_and_a_disconnect_cancels_at_the_next_block(url: str) -> None:
    aborted = metric(url, "vllm:request_success_total", finished_reason="abort")
    long_answer = {**CHAT, "max_tokens": 900, "ignore_eos": True, "stream": True}
    queued: list[httpx.Response] = []
    with httpx.Client(timeout=60.0) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=long_answer, headers=AUTH) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()  # kept: a dropped iterator closes the response, i.e. hangs up
            next(lines)  # the first block is out: the engine is busy with this request
            waiter = threading.Thread(target=lambda: queued.append(post(url, "/v1/chat/completions", CHAT)))
            waiter.start()
            wait_for(lambda: metric(url, "vllm:num_requests_waiting") == 1)
            refused = post(url, "/v1/chat/completions", CHAT)
            error = assert_error(refused, 429, None, "queue_full")
            assert error["type"] == "rate_limit_error" and "one request at a time" in error["message"]
            assert refused.headers["Retry-After"] == "1"
            generated = metric(url, "vllm:generation_tokens_total")
        # The client hung up mid-stream: the engine stops at its next block and takes the queued request.
        wait_for(lambda: metric(url, "vllm:request_success_total", finished_reason="abort") == aborted + 1)
    waiter.join(30)
    assert queued[0].status_code == 200, queued[0].text
    # After the hang-up: at most the block in flight and the next (5 tokens each), then the queued 4 tokens.
    assert metric(url, "vllm:generation_tokens_total") - generated <= 2 * 5 + 4


def test_a_non_streaming_client_that_leaves_cancels_too(url: str) -> None:
    aborted = metric(url, "vllm:request_success_total", finished_reason="abort")
    long_answer = {**CHAT, "max_tokens": 900, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        post(url, "/v1/chat/completions", long_answer, timeout=1.0)
    wait_for(lambda: metric(url, "vllm:request_success_total", finished_reason="abort") == aborted + 1)
    assert post(url, "/v1/chat/completions", CHAT).status_code == 200
