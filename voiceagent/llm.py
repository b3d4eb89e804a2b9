"""The voice agent's language model: the engine in this process, or any OpenAI-compatible server.

This is the one module of `voiceagent` that imports `engine`. Both backends stream a reply as `ReplyBlock`s:
committed text that never needs taking back, so the agent may speak each block the moment it arrives.

- `LocalLLM` runs the synchronous engine on the process's engine thread (engine/engine_thread.py: every
  forward on one thread, so one OpenMP team) and hands blocks to the event loop. Leaving the
  stream early (a barge-in cancels the task, or the consumer closes the generator) sets the engine's cancel
  event, and generation stops at the next block. One LocalLLM is one conversation: its KV cache keeps the
  prefix the next turn shares. LocalLLMs on one engine take turns block by block: each block, prefill and
  score is one job on that thread, run in the order asked for.
  A block that does not come within `block_timeout_s` (VOICEAGENT_LLM_TIMEOUT_S: a stalled engine) fails
  the reply with LLMError and sets the cancel event; the next reply waits at most as long for it to stop.
  On the CPU its forwards wait for the speech jobs (ASR, TTS) of the pipeline's `CpuLane` (cpu_lane.py).
- `RemoteLLM` (voiceagent/remote_llm.py) streams /v1/chat/completions over SSE (`python -m engine serve`,
  or vLLM for a 70B target).

`connect_llm(Settings())` picks the backend from VOICEAGENT_LLM ("local" or a base URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from voiceagent.config import Settings
from voiceagent.cpu_lane import NO_LANE, CpuLane
from voiceagent.llm_types import (
    DEFAULT_OPTIONS,
    LLM,
    BlockCost,
    LLMError,
    Message,
    PrefillingLLM,
    ProposingLLM,
    ReplyBlock,
    ReplyOptions,
    TurnScoringLLM,
)
from voiceagent.remote_llm import RemoteLLM

if TYPE_CHECKING:
    from engine import CommittedBlock, Conversation, Engine
    from engine.engine_thread import EngineThread
    from engine.turn_end import ScoreModel

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
    "engine_lane",
    "llm_model_status",
    "load_local_engine",
    "prepare_llm_models",
]

END_MARKS = " \t\n.,;:!?…"  # dropped from the end of a partial before scoring its end of turn
DEFAULT_BLOCK_TIMEOUT_S = 60.0  # Settings.llm_timeout_s's default
# A reply's first phrase (voiceagent/chunker.py: 4 words at most) ends within its first tokens. Only those
# blocks wait for the event loop to begin the phrase's TTS (CpuLane.settle): later phrases have the audio
# before them to render in, and a busy loop (many sessions) would hold every block. And on a CPU those
# tokens come from plain steps (`plain_tokens`): a drafted block delivers its tokens only at its end, and
# the first phrase waited ~600 ms more for a 5-token block (AMD EPYC AVX2, voiceagent bench, 2026-12-01).
FIRST_PHRASE_TOKENS = 12


class LocalLLM:
    """The engine in this process, one conversation of it (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        conversation: Conversation | None = None,
        block_timeout_s: float = DEFAULT_BLOCK_TIMEOUT_S,
        lane: CpuLane = NO_LANE,
        turn_score_model: ScoreModel = "draft",
        turn_head: bool = False,
    ) -> None:
        self.engine, self.block_timeout_s, self.lane = engine, block_timeout_s, lane
        # whose cache scores the end of turn (VOICEAGENT_TURN_SCORE_MODEL), and whether that model's trained
        # end-of-turn head gives the score where it has one (VOICEAGENT_TURN_HEAD; engine/turn_head.py)
        self.turn_score_model, self.turn_head = turn_score_model, turn_head
        self._conversation = conversation or engine.new_conversation()
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
            blocks = self._conversation.generate(
                prompt, params, cancel=cancel, proposal=proposal, plain_tokens=FIRST_PHRASE_TOKENS
            )
            arrived = self._start(blocks, cancel)
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

    def _start(
        self, blocks: Iterator[CommittedBlock], cancel: threading.Event
    ) -> asyncio.Queue[ReplyBlock | Exception]:
        """Makes `blocks` on the engine thread, one job a block, so the blocks, prefills and scores of other
        conversations queue between them (first come, first served); returns the queue (of this event
        loop) they arrive on."""
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[ReplyBlock | Exception] = asyncio.Queue()
        finished: asyncio.Future[None] = loop.create_future()
        steps = self._after_speech(blocks)
        handed = 0  # the reply's tokens handed over so far

        def hand_over(item: ReplyBlock | Exception) -> None:
            nonlocal handed
            try:
                loop.call_soon_threadsafe(arrived.put_nowait, item)
            except RuntimeError:  # the event loop is closed: nobody is listening, the generation ends
                cancel.set()
                return
            handed += (item.n_tokens or 1) if isinstance(item, ReplyBlock) else 0
            if handed <= FIRST_PHRASE_TOKENS:  # a first phrase this block ends: its TTS begins first
                self.lane.settle(loop)

        def finish() -> None:
            def done() -> None:
                if not finished.done():
                    finished.set_result(None)

            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done)

        def step() -> None:  # on the engine thread: one block, then the next step queues behind others
            try:
                made = next(steps, None)
            except Exception as error:  # handed to the event loop, where the stream raises LLMError
                hand_over(error)
                finish()
                return
            if made is None:  # the generation has ended (its last block was handed over before)
                finish()
                return
            block, cost = made
            hand_over(ReplyBlock(block.text, len(block.token_ids), block.n_drafted, block.n_accepted,
                                 block.finish_reason, block.token_ids, cost))  # fmt: skip
            _engine_thread().submit(step)

        self._running = self._generation = finished
        _engine_thread().submit(step)
        return arrived

    def _after_speech(self, blocks: Iterator[CommittedBlock]) -> Iterator[tuple[CommittedBlock, BlockCost]]:
        """`blocks`, each begun once the speech jobs running before it have ended (voiceagent/cpu_lane.py),
        with where its time went: what it waited for since the last block was handed on (that hand-over's
        settling, the other conversations' engine work queued before it, the speech jobs), and its work."""
        handed = time.perf_counter()
        while True:
            self.lane.wait_turn()
            began, held = time.perf_counter(), self.engine.paused_s
            block = next(blocks, None)
            if block is None:
                return
            done, held_s = time.perf_counter(), self.engine.paused_s - held
            draft_s, verify_s = block.timing.draft_s, block.timing.verify_s
            seconds = (began - handed, done - began, draft_s, verify_s, held_s)
            cost = BlockCost(*(round(1000 * s, 2) for s in seconds))
            handed = done
            yield block, cost

    async def aclose(self) -> None:
        self._cancel.set()
        if self._running is not None:
            with contextlib.suppress(TimeoutError):  # a stalled engine: its job is left behind
                await asyncio.wait_for(asyncio.shield(self._running), self.block_timeout_s)

    async def prefill(self, messages: Sequence[Message], *, draft_only: bool = False) -> bool:
        """Caches the prompt of `messages` ahead of a reply to them or to their continuation (e.g. the
        user's words so far). Skipped (False) while a reply runs; a failure is dropped, since a prefill
        is only a head start. A reply asked for meanwhile waits for it."""
        if self._running is not None and not self._running.done():
            return False
        prompt = self._fitting_prompt(messages, room=1)
        if messages and messages[-1]["role"] == "user":  # the words only: more of them come, then the tail
            prompt = self._user_words(prompt)

        def work() -> bool:  # on the engine thread
            try:
                self.lane.wait_turn()
                self._conversation.prefill(prompt, draft_only=draft_only)
                return True
            except Exception:  # noqa: BLE001 - the reply will prefill whatever is missing
                return False

        job = asyncio.wrap_future(_engine_thread().submit(work))
        self._running = job
        return bool(await asyncio.shield(job))

    async def end_of_turn_probability(
        self, messages: Sequence[Message], *, learned: bool | None = None, reply_next: bool = False
    ) -> float | None:
        """P(the user's turn is complete): `messages` end with the user's words so far (a partial; its final
        marks are dropped, engine/turn_end.py says why). None while a reply is being written or if scoring
        fails: the caller then keeps its silence rule; a cancelled reply or a prefill is waited for. The
        words stay cached, a head start for the reply. `learned`: the trained head's score or the raw one
        (None: `turn_head`). `reply_next`: a reply to `messages` is asked for next (a preemptive one):
        the score's forward carries that reply's prompt and gives its first drafted token (its first token
        where the target scores; `Conversation.end_of_turn_probability`'s `reply_prompt`; the prompt as
        fitted with room for one id: a history trimmed otherwise for the reply's room only loses the head
        start)."""
        *history, user = messages
        words = {**user, "content": user["content"].rstrip(END_MARKS)}
        if not words["content"]:
            return None
        if self._running is not None and not self._running.done():
            if self._running is self._generation and not self._cancel.is_set():
                return None  # a reply is being written
            with contextlib.suppress(TimeoutError):  # a cancelled reply or a prefill ends soon
                await asyncio.wait_for(asyncio.shield(self._running), self.block_timeout_s)
        learned = self.turn_head if learned is None else learned
        try:
            prompt = self._user_words(self._fitting_prompt([*history, words], room=1))
            reply = self._fitting_prompt(messages, room=1) if reply_next else None
        except Exception:  # noqa: BLE001 - no score: the silence rule decides
            return None
        job = asyncio.wrap_future(_engine_thread().submit(self._score_turn, prompt, learned, reply))
        self._running = job
        return await asyncio.shield(job)

    def _user_words(self, prompt: list[int]) -> list[int]:
        """The chat prompt of a history that ends with the user's message, cut before its end-of-turn id."""
        from engine.turn_end import turn_marks, user_words

        return user_words(prompt, turn_marks(self.engine.tokenizer).end_of_turn_id)

    def _score_turn(self, prompt: list[int], learned: bool, reply: list[int] | None) -> float | None:
        """On the engine thread: the score of the user's words `prompt` (None if scoring fails); `reply`:
        the prompt of the reply asked for next, if any."""
        try:
            self.lane.wait_turn()
            return self._conversation.end_of_turn_probability(
                prompt, model=self.turn_score_model, learned=learned, reply_prompt=reply
            )
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
        conversation = self._conversation.fork()
        return LocalLLM(
            self.engine,
            conversation=conversation,
            block_timeout_s=self.block_timeout_s,
            lane=self.lane,
            turn_score_model=self.turn_score_model,
            turn_head=self.turn_head,
        )


def _engine_thread() -> EngineThread:
    """The process's engine thread (engine/engine_thread.py), where every forward of the engine runs."""
    from engine.engine_thread import ENGINE_THREAD

    return ENGINE_THREAD


def prepare_llm_models(install_missing: bool, log: Callable[[str], None]) -> None:
    """Assembles and converts the engine's bundled language models, and makes the files they draft from
    on the ggml backend where llama.cpp is installed (engine/ggml_draft.py); idempotent."""
    from engine.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET
    from engine.ggml import available
    from engine.ggml_draft import ggml_draft_gguf
    from engine.gguf_int4 import prepare_packed
    from engine.models import prepare

    for name in BUNDLED:
        prepare(name, install_missing=install_missing, log=log)
        if available():
            ggml_draft_gguf(name, log=log)  # the file itself where the model names no draft type
    # The native backend's kernels, and the blocks of the target and of the draft's own file, rearranged.
    prepare_packed(DEFAULT_TARGET, log=log)
    if available():
        prepare_packed(str(ggml_draft_gguf(DEFAULT_DRAFT, log=log)), log=log, draft=True)


def llm_model_status() -> list[tuple[str, bool, str]]:
    """(name, ready, directory) of each bundled language model."""
    from engine.models import status

    return [(entry.name, entry.ready, str(entry.directory)) for entry in status()]


def load_local_engine(settings: Settings) -> Engine:
    """The in-process engine the settings describe, loaded once and shared by every session."""
    from engine import EngineOptions, load_engine

    return load_engine(EngineOptions.from_attributes(settings))  # target, draft ("none": plain), dtype, ...


def engine_lane(engine: Engine | None) -> CpuLane:
    """A CPU lane for a local engine on the CPU (one per engine); none (`NO_LANE`) on a GPU or without.
    The engine's forwards also hold between their layers for a speech job begun meanwhile
    (`CpuLane.pause_point`; PyTorch models: llama.cpp's graph runs whole)."""
    if engine is None or engine.target.device.type != "cpu":
        return NO_LANE
    lane = CpuLane()
    engine.pause_between_layers(lane.pause_point)
    return lane


def connect_llm(settings: Settings, engine: Engine | None = None) -> LLM:
    """The backend VOICEAGENT_LLM names. Locally, pass `engine` to share one loaded engine across sessions."""
    if not settings.llm_is_local:
        api_key = settings.llm_api_key.get_secret_value() if settings.llm_api_key is not None else None
        return RemoteLLM(
            settings.llm, model=settings.llm_model, api_key=api_key, timeout_s=settings.llm_timeout_s
        )
    engine = engine if engine is not None else load_local_engine(settings)
    return LocalLLM(
        engine,
        block_timeout_s=settings.llm_timeout_s,
        turn_score_model=settings.turn_score_model,
        turn_head=settings.turn_head,
    )
