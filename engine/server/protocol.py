"""The OpenAI wire format of the engine server: validated request bodies, response bodies, error bodies.

Requests are parsed strictly (a string is not a number) and unknown fields are ignored, as vLLM does.
Values the engine cannot honour (n > 1, logprobs, penalties, tools) are refused with a 400 that says so,
rather than silently ignored. Errors have OpenAI's shape: {"error": {message, type, param, code}}.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_STOP_STRINGS = 16
INT64 = 2**63


class APIError(Exception):
    """An error answered to the client as an OpenAI error object with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        """{"role", "content"} for the chat template ("developer" is OpenAI's newer name for "system")."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingRequest(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions (vLLM's top_k and ignore_eos included)."""

    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM's extension: -1 or 0 disables it
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-INT64, lt=2 * INT64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    ignore_eos: bool = False
    user: str | None = None

    @model_validator(mode="after")
    def _supported(self) -> _SamplingRequest:
        if self.n != 1:
            raise _unsupported("n", "n must be 1: the engine serves one sequence per request")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0.0:
                raise _unsupported(name, f"{name} is not supported by this engine; leave it at 0")
        if self.stream_options is not None and not self.stream:
            raise _unsupported("stream_options", "stream_options is only allowed when stream is true")
        stops = self.stop_strings()
        if len(stops) > MAX_STOP_STRINGS:
            raise _unsupported("stop", f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not s for s in stops):
            raise _unsupported("stop", "stop strings must not be empty")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None

    @model_validator(mode="after")
    def _chat_supported(self) -> ChatCompletionRequest:
        if self.logprobs or self.top_logprobs is not None:
            raise _unsupported("logprobs", "logprobs are not supported by this engine")
        if self.tools:
            raise _unsupported("tools", "tools are not supported by this engine")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _completion_supported(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise _unsupported("prompt", "give one prompt per request (a string or a list of token ids)")
        for name, unsupported in (
            ("echo", self.echo),
            ("logprobs", self.logprobs is not None),
            ("best_of", self.best_of not in (None, 1)),
            ("suffix", self.suffix is not None),
        ):
            if unsupported:
                raise _unsupported(name, f"{name} is not supported by this engine")
        return self


def _unsupported(param: str, message: str) -> ValueError:
    # A ValueError inside a validator becomes a ValidationError whose location we map back to `param`.
    return ValueError(f"{param}|{message}")


Request = TypeVar("Request", bound=BaseModel)


def parse_request(raw: bytes, model: type[Request]) -> Request:
    """Parses a JSON body into `model`; any problem becomes a 400 APIError naming the parameter."""
    try:
        parsed = json.loads(raw)
    except ValueError as error:  # not UTF-8, not JSON, or an integer of over 4300 digits
        raise APIError(
            400,
            f"We could not parse the JSON body of your request ({error}). The body must be a JSON object.",
        ) from None
    except RecursionError:
        raise APIError(400, "The JSON body of your request is nested too deeply to parse.") from None
    if not isinstance(parsed, dict):
        raise APIError(400, "The request body must be a JSON object.")
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise _as_api_error(error) from None


def _as_api_error(error: ValidationError) -> APIError:
    first = error.errors(include_url=False)[0]
    param = _param_path(first["loc"])
    if first["type"] == "missing":
        return APIError(
            400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
        )
    message = str(first["msg"])
    if first["type"] == "value_error" and "|" in message:
        param, message = message.removeprefix("Value error, ").split("|", 1)
        return APIError(400, message, param=param, code="unsupported_parameter")
    value = first.get("input")
    shown = (
        json.dumps(value)[:80] if isinstance(value, str | int | float | bool | None) else type(value).__name__
    )
    return APIError(
        400, f"Invalid value for '{param}': {message} (got {shown}).", param=param, code="invalid_value"
    )


_TYPE_TAGS = {"str", "int", "float", "bool", "none"}


def _param_path(loc: tuple[int | str, ...]) -> str:
    # pydantic names union members as extra path parts ("str", "list[str]"): keep only the field path.
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _TYPE_TAGS:
            path += f".{part}" if path else part
        else:
            break
    return path


# Response bodies. `block` on a chunk and `speculative` on a whole answer are this engine's additions (clients
# ignore unknown fields): what each committed block drafted and accepted, and the request's totals.


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event; a dict is sent as JSON, a string (e.g. "[DONE]") as it is."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def usage_body(n_prompt: int, n_completion: int, n_cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": n_completion,
        "total_tokens": n_prompt + n_completion,
        "prompt_tokens_details": {"cached_tokens": n_cached},
    }


def chat_chunk(
    request_id: str,
    created: int,
    model: str,
    delta: dict[str, str],
    finish_reason: str | None,
    block: dict[str, int] | None,
) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return _chunk(request_id, created, model, "chat.completion.chunk", choice, block)


def completion_chunk(
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    block: dict[str, int] | None,
) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return _chunk(request_id, created, model, "text_completion", choice, block)


def _chunk(
    request_id: str, created: int, model: str, kind: str, choice: dict[str, Any], block: dict[str, int] | None
) -> dict[str, Any]:
    """One streamed SSE payload; `block` (n_tokens, n_drafted, n_accepted, position) when it carries text."""
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if block is not None:
        chunk["block"] = block
    return chunk


def usage_chunk(
    request_id: str, created: int, model: str, kind: str, usage: dict[str, Any]
) -> dict[str, Any]:
    """The last chunk of a stream with stream_options.include_usage: no choices, the usage."""
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }


def chat_completion_body(
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: dict[str, Any],
    speculative: dict[str, Any],
) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
        "speculative": speculative,
    }


def completion_body(
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: dict[str, Any],
    speculative: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
        "speculative": speculative,
    }
