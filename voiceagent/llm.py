"""The voice agent's language model: the engine in this process, or any OpenAI-compatible server.

This is the one module of `voiceagent` that imports `engine`. Both backends stream a reply as `ReplyBlock`s:
committed text that never needs taking back, so the agent may speak each block the moment it arrives.

- `LocalLLM` runs the synchronous engine on a worker thread and hands blocks to the event loop. Leaving the
  stream early (a barge-in cancels the task, or the consumer closes the generator) sets the engine's cancel
  event, and generation stops at the next block. One LocalLLM is one conversation: its KV cache keeps the
  prefix the next turn shares. LocalLLMs on one engine take turns block by block under the engine's lock.
  A block that does not come within `block_timeout_s` (VOICEAGENT_LLM_TIMEOUT_S: a stalled engine) fails
  the reply with LLMError and sets the cancel event; the next reply waits at most as long for it to stop.
- `RemoteLLM` streams /v1/chat/completions over SSE (`python -m engine serve`, or vLLM for a 70B target).
  Leaving early closes the connection; the engine server then cancels the generation at its next block.
  Block statistics (drafted, accepted) come with this project's server; vLLM does not send them (None).

`connect_llm(Settings())` picks the backend from VOICEAGENT_LLM ("local" or a base URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from voiceagent.config import Settings
from voiceagent.llm_types import (
    DEFAULT_OPTIONS,
    LLM,
    LLMError,
    Message,
    PrefillingLLM,
    ProposingLLM,
    ReplyBlock,
    ReplyOptions,
    TurnScoringLLM,
)

if TYPE_CHECKING:
    from engine import CommittedBlock, Conversation, Engine

__all__ = [  # the shared types are re-exported: every caller imports them from here
    "DEFAULT_OPTIONS",
    "LLM",
    "LLMError",
    "LocalLLM",
    "Message",
    "PrefillingLLM",
    "ProposingLLM",
    "RemoteLLM",
    "ReplyBlock",
    "ReplyOptions",
    "TurnScoringLLM",
    "connect_llm",
    "llm_model_status",
    "load_local_engine",
    "prepare_llm_models",
]

END_MARKS = " \t\n.,;:!?…"  # dropped from the end of a partial before scoring its end of turn
DEFAULT_BLOCK_TIMEOUT_S = 60.0  # Settings.llm_timeout_s's default


class LocalLLM:
    """The engine in this process, one conversation of it (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        conversation: Conversation | None = None,
        block_timeout_s: float = DEFAULT_BLOCK_TIMEOUT_S,
    ) -> None:
        self.engine, self.block_timeout_s = engine, block_timeout_s
        self._conversation = conversation or engine.new_conversation()
        self._lock = engine.lock  # shared by every conversation of the engine (and its server worker)
        self._running: asyncio.Future[Any] | None = None  # the generation or prefill in flight
        self._generation: asyncio.Future[Any] | None = None  # the last generation's (not a prefill's)
        self._cancel = threading.Event()

    def stream(
        self, messages: Sequence[Message], options: ReplyOptions = DEFAULT_OPTIONS
    ) -> AsyncIterator[ReplyBlock]:
        """Streams the reply's committed blocks; raises LLMError for bad input or an engine failure."""
        return self.stream_proposed(messages, options, ())

    async def stream_proposed(
        self, messages: Sequence[Message], options: ReplyOptions, proposal: Sequence[int]
    ) -> AsyncIterator[ReplyBlock]:
        """As `stream`, with `proposal` (token ids) verified as the reply's likely start."""
        from engine import SamplingParams

        if self._running is not None:
            try:  # a cancelled turn ends at its next block; then it is free
                await asyncio.wait_for(asyncio.shield(self._running), self.block_timeout_s)
            except TimeoutError:
                limit = self.block_timeout_s
                raise LLMError(f"the engine did not stop its previous reply within {limit:g} s") from None
        self._cancel = cancel = threading.Event()
        try:
            prompt = self._fitting_prompt(messages, room=options.max_tokens)
            params = SamplingParams(options.temperature, options.top_p, 0, options.max_tokens, options.stop,
                                    options.seed)  # fmt: skip
            blocks = self._conversation.generate(prompt, params, cancel=cancel, proposal=proposal)
            arrived = self._start(blocks)
        except ValueError as error:
            raise LLMError(str(error)) from error
        try:
            while True:
                try:
                    item = await asyncio.wait_for(arrived.get(), self.block_timeout_s)
                except TimeoutError:
                    limit = self.block_timeout_s
                    raise LLMError(
                        f"the engine sent no block within {limit:g} s; the reply is cancelled"
                    ) from None
                if isinstance(item, Exception):
                    raise LLMError(f"the engine failed: {type(item).__name__}: {item}") from item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            cancel.set()

    def _start(self, blocks: Iterator[CommittedBlock]) -> asyncio.Queue[ReplyBlock | Exception]:
        """Runs `blocks` on a thread of its own; returns the queue (of this event loop) they arrive on."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[ReplyBlock | Exception] = asyncio.Queue()
        finished: asyncio.Future[None] = loop.create_future()

        def hand_over(item: ReplyBlock | Exception) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening
                loop.call_soon_threadsafe(arrived.put_nowait, item)

        def finish() -> None:
            if not finished.done():
                finished.set_result(None)

        def work() -> None:
            try:
                self._pump(blocks, hand_over)
            finally:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(finish)

        self._running = self._generation = finished
        threading.Thread(target=work, name="voiceagent-llm", daemon=True).start()
        return arrived

    def _pump(
        self, blocks: Iterator[CommittedBlock], deliver: Callable[[ReplyBlock | Exception], None]
    ) -> None:
        """Worker thread: steps the engine one block at a time under the engine's lock."""
        try:
            for block in self._lock.each(blocks):
                deliver(ReplyBlock(block.text, len(block.token_ids), block.n_drafted, block.n_accepted,
                                   block.finish_reason, block.token_ids))  # fmt: skip
        except Exception as error:  # handed to the event loop, where the stream raises LLMError
            deliver(error)

    async def aclose(self) -> None:
        self._cancel.set()
        if self._running is not None:
            with contextlib.suppress(TimeoutError):  # a stalled engine: its daemon thread is left behind
                await asyncio.wait_for(asyncio.shield(self._running), self.block_timeout_s)

    async def prefill(self, messages: Sequence[Message], *, draft_only: bool = False) -> bool:
        """Caches the prompt of `messages` ahead of a reply to them or to their continuation (e.g. the
        user's words so far). Skipped (False) while a reply runs; a failure is dropped, since a prefill
        is only a head start. A reply asked for meanwhile waits for it."""
        if self._running is not None and not self._running.done():
            return False
        prompt = self._fitting_prompt(messages, room=1)

        def work() -> bool:
            try:
                with self._lock:
                    self._conversation.prefill(prompt, draft_only=draft_only)
                return True
            except Exception:  # noqa: BLE001 - the reply will prefill whatever is missing
                return False

        job = asyncio.get_running_loop().run_in_executor(None, work)
        self._running = job
        return bool(await asyncio.shield(job))

    async def end_of_turn_probability(self, messages: Sequence[Message]) -> float | None:
        """P(the user's turn is complete): `messages` end with the user's words so far (a partial; its final
        marks are dropped, engine/turn_end.py says why). None while a reply is being written or if scoring
        fails: the caller then keeps its silence rule; a cancelled reply or a prefill is waited for. The
        words stay cached, a head start for the reply."""
        *history, user = messages
        words = {**user, "content": user["content"].rstrip(END_MARKS)}
        if not words["content"]:
            return None
        if self._running is not None and not self._running.done():
            if self._running is self._generation and not self._cancel.is_set():
                return None  # a reply is being written
            with contextlib.suppress(TimeoutError):  # a cancelled reply or a prefill ends soon
                await asyncio.wait_for(asyncio.shield(self._running), self.block_timeout_s)
        job = asyncio.get_running_loop().run_in_executor(None, self._score_turn, [*history, words])
        self._running = job
        return await asyncio.shield(job)

    def _score_turn(self, messages: list[Message]) -> float | None:
        from engine.turn_end import turn_marks, user_words

        try:
            end_of_turn_id = turn_marks(self.engine.tokenizer).end_of_turn_id
            prompt = user_words(self._fitting_prompt(messages, room=1), end_of_turn_id)
            with self._lock:
                return self._conversation.end_of_turn_probability(prompt)
        except Exception:  # noqa: BLE001 - no score: the silence rule decides
            return None

    def _fitting_prompt(self, messages: Sequence[Message], room: int) -> list[int]:
        """The chat prompt of `messages`, the oldest turns after the system prompt dropped until `room`
        ids are left for the reply in this conversation's cache (the engine names a prompt too long
        to fit even so)."""
        from engine import chat_prompt

        kept = [dict(message) for message in messages]
        while True:
            prompt = chat_prompt(self.engine.tokenizer, kept)
            if len(prompt) + room <= self._conversation.max_seq_len:
                return prompt
            older = [i for i, message in enumerate(kept[:-1]) if message["role"] != "system"]
            if not older:
                return prompt
            del kept[older[0]]

    def fork(self) -> LocalLLM:
        """A new conversation that starts with this one's cached history (e.g. a warmed system prompt)."""
        return LocalLLM(
            self.engine, conversation=self._conversation.fork(), block_timeout_s=self.block_timeout_s
        )


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


def prepare_llm_models(install_missing: bool, log: Callable[[str], None]) -> None:
    """Assembles and converts the engine's bundled language models (idempotent)."""
    from engine.bundled import BUNDLED
    from engine.models import prepare

    for name in BUNDLED:
        prepare(name, install_missing=install_missing, log=log)


def llm_model_status() -> list[tuple[str, bool, str]]:
    """(name, ready, directory) of each bundled language model."""
    from engine.models import status

    return [(entry.name, entry.ready, str(entry.directory)) for entry in status()]


def load_local_engine(settings: Settings) -> Engine:
    """The in-process engine the settings describe, loaded once and shared by every session."""
    from engine import EngineOptions, load_engine

    return load_engine(EngineOptions.from_attributes(settings))  # target, draft ("none": plain), dtype, ...


def connect_llm(settings: Settings, engine: Engine | None = None) -> LLM:
    """The backend VOICEAGENT_LLM names. Locally, pass `engine` to share one loaded engine across sessions."""
    if not settings.llm_is_local:
        api_key = settings.llm_api_key.get_secret_value() if settings.llm_api_key is not None else None
        return RemoteLLM(
            settings.llm, model=settings.llm_model, api_key=api_key, timeout_s=settings.llm_timeout_s
        )
    engine = engine if engine is not None else load_local_engine(settings)
    return LocalLLM(engine, block_timeout_s=settings.llm_timeout_s)
