"""LocalLLMs on one engine take turns block by block on the engine thread (first come, first served)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine import EngineOptions, turn_end
from engine.engine_thread import ENGINE_THREAD
from tests.fakes import tiny_engine
from voiceagent.config import Settings
from voiceagent.llm import LocalLLM


def test_a_reply_prefill_and_score_run_on_the_engine_thread_and_leave_it_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.gateway.drops import ChatTokenizer
    from voiceagent.llm import ReplyOptions

    engine = tiny_engine()
    engine.tokenizer = ChatTokenizer()
    history = [{"role": "user", "content": "a question please"}]
    closing = ChatTokenizer().apply_chat_template(history)[-2]  # the toy template's "end of turn": 'please'
    monkeypatch.setattr(turn_end, "turn_marks", lambda _: turn_end.TurnMarks(closing, ()))
    ran_on: set[threading.Thread] = set()
    engine.pause_between_layers(lambda: ran_on.add(threading.current_thread()))
    llm = LocalLLM(engine)

    async def turn() -> int:
        assert await llm.prefill(history)
        assert await llm.end_of_turn_probability(history) is not None
        blocks = [block async for block in llm.stream(history, ReplyOptions(max_tokens=8))]
        await llm.aclose()
        return sum(block.n_tokens or 0 for block in blocks)

    assert asyncio.run(turn()) == 8
    assert ran_on == {ENGINE_THREAD.run(threading.current_thread)} and ENGINE_THREAD.idle()
    assert not any(thread.name == "voiceagent-llm" for thread in threading.enumerate())


class RecordingConversation:
    """An engine conversation that notes, on the engine thread, whose block is being made (and takes 10 ms
    more a block, so two replies surely overlap)."""

    def __init__(self, conversation: object, name: str, order: list[str]) -> None:
        self._conversation, self.name, self.order = conversation, name, order

    def __getattr__(self, attribute: str) -> object:
        return getattr(self._conversation, attribute)

    def generate(self, prompt_ids: object, params: object = None, **options: object) -> object:
        blocks = self._conversation.generate(prompt_ids, params, **options)  # type: ignore[attr-defined]

        def noted() -> object:
            for block in blocks:
                self.order.append(self.name)
                time.sleep(0.01)
                yield block

        return noted()


def test_two_replies_on_one_engine_take_turns_block_by_block() -> None:
    from tests.gateway.drops import ChatTokenizer
    from voiceagent.llm import ReplyOptions

    engine = tiny_engine()
    engine.tokenizer = ChatTokenizer()
    order: list[str] = []
    llms = {
        name: LocalLLM(engine, conversation=RecordingConversation(engine.new_conversation(), name, order))
        for name in "AB"
    }

    async def reply(name: str) -> int:
        history = [{"role": "user", "content": f"question {name}"}]
        return len([block async for block in llms[name].stream(history, ReplyOptions(max_tokens=40))])

    async def both() -> list[int]:
        return list(await asyncio.gather(reply("A"), reply("B")))

    counts = asyncio.run(both())
    assert counts == [order.count("A"), order.count("B")] and min(counts) >= 5
    # while both replies have blocks left, they alternate: A B A B ...
    last = {name: len(order) - 1 - order[::-1].index(name) for name in "AB"}
    both_running = order[max(order.index("B") - 1, 0) : min(last.values()) + 1]
    assert all(x != y for x, y in zip(both_running, both_running[1:], strict=False)), order


def test_the_settings_name_the_engine_to_load() -> None:
    settings = Settings(draft="none", max_seq_len=512)
    expected = EngineOptions(settings.target, None, max_seq_len=512, gamma=settings.gamma,
                             draft_quant=settings.draft_quant, backend=settings.backend)  # fmt: skip
    assert EngineOptions.from_attributes(settings) == expected
