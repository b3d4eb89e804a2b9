"""The voice agent's LLM over HTTP: any OpenAI-compatible server (`python -m engine serve`, vLLM), streamed.

It streams /v1/chat/completions over SSE as `ReplyBlock`s. Leaving early closes the connection; the engine
server then cancels the generation at its next block. Block statistics (drafted, accepted) come with this
project's server; vLLM does not send them (None). Import it from voiceagent/llm.py, as every caller does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from voiceagent.llm_types import DEFAULT_OPTIONS, LLMError, Message, ReplyBlock, ReplyOptions


class RemoteLLM:
    """An OpenAI-compatible server at `base_url` (e.g. http://127.0.0.1:8000/v1), streamed over SSE."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._owns_client = client is None

    async def model(self) -> str:
        """The model to ask for: the configured one, or the first the server lists."""
        if self._model is None:
            url = f"{self.base_url}/models"
            try:
                response = await self._client.get(url, headers=self._headers)
            except httpx.HTTPError as error:
                raise LLMError(f"cannot reach {url}: {type(error).__name__}: {error}") from error
            if response.status_code != 200:
                raise LLMError(f"{url} answered {_error_message(response)}")
            models = response.json().get("data") or []
            if not models:
                raise LLMError(f"{url} lists no model")
            self._model = str(models[0]["id"])
        return self._model

    async def stream(
        self, messages: Sequence[Message], options: ReplyOptions = DEFAULT_OPTIONS
    ) -> AsyncIterator[ReplyBlock]:
        """Streams the reply's blocks; raises LLMError if the server refuses, fails or cannot be reached."""
        url = f"{self.base_url}/chat/completions"
        body: dict[str, Any] = {
            "model": await self.model(),
            "messages": [dict(message) for message in messages],
            "stream": True,
            "temperature": options.temperature,
            "top_p": options.top_p,
            "max_tokens": options.max_tokens,
        }
        if options.stop:
            body["stop"] = list(options.stop)
        if options.seed is not None:
            body["seed"] = options.seed
        finished = False
        try:
            async with self._client.stream("POST", url, json=body, headers=self._headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise LLMError(f"{url} answered {_error_message(response)}")
                async for data in _sse_data(response.aiter_lines()):
                    if data == "[DONE]":
                        break
                    block = _reply_block(data)
                    if block is not None:
                        finished = finished or block.finish_reason is not None
                        yield block
        except httpx.HTTPError as error:
            raise LLMError(f"{url}: {type(error).__name__}: {error}") from error
        if not finished:
            raise LLMError(f"{url}: the stream ended before the reply was finished")

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each server-sent event (multi-line data joined with newlines; other fields ignored)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


def _reply_block(data: str) -> ReplyBlock | None:
    """A chat.completion.chunk as a ReplyBlock; None for chunks without text or a finish (role, usage)."""
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as error:
        raise LLMError(f"the server sent a chunk that is not JSON: {data[:120]!r}") from error
    if "error" in chunk:
        raise LLMError(f"the server failed mid-stream: {chunk['error'].get('message', chunk['error'])}")
    choices = chunk.get("choices") or []
    if not choices:
        return None
    text = (choices[0].get("delta") or {}).get("content") or ""
    finish_reason = choices[0].get("finish_reason")
    block = chunk.get("block")  # this project's server: what the block drafted and accepted
    if not text and finish_reason is None and block is None:
        return None
    if block is None:
        return ReplyBlock(text, finish_reason=finish_reason)
    return ReplyBlock(
        text, block.get("n_tokens"), block.get("n_drafted"), block.get("n_accepted"), finish_reason
    )


def _error_message(response: httpx.Response) -> str:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    return f"{response.status_code}: {message}"
