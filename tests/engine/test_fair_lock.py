"""The engine's lock is granted first come, first served: conversations queue fairly for the engine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.fakes import tiny_engine
from voiceagent.llm import FairLock, LocalLLM, engine_lock


def wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_waiters_get_the_lock_in_the_order_they_asked() -> None:
    lock, granted = FairLock(), []

    def take(number: int) -> None:
        with lock:
            granted.append(number)

    lock.acquire()
    threads = []
    for number in range(12):
        thread = threading.Thread(target=take, args=(number,))
        thread.start()
        threads.append(thread)
        wait_for(lambda n=number: lock.waiting() == n + 1)  # type: ignore[misc]
    lock.release()
    for thread in threads:
        thread.join(5)
    assert granted == list(range(12))
    assert not lock.locked() and lock.waiting() == 0


def test_a_thread_that_asks_again_at_once_goes_behind_the_waiters() -> None:
    """Two conversations stepping block by block take turns once both are waiting (a plain Lock lets the
    releasing thread win it back, so one reply can hold the engine to its end)."""
    lock, steps = FairLock(), []
    b_waiting = threading.Event()

    def conversation(name: str, n_steps: int) -> None:
        for _ in range(n_steps):
            with lock:
                steps.append(name)
                if name == "A" and len(steps) == 3:
                    b.start()
                    wait_for(lambda: lock.waiting() == 1)
                    b_waiting.set()

    a = threading.Thread(target=conversation, args=("A", 20))
    b = threading.Thread(target=conversation, args=("B", 20))
    a.start()
    a.join(10)
    b.join(10)
    assert b_waiting.is_set() and len(steps) == 40
    first_b = steps.index("B")
    assert first_b == 3  # B asked while A held it: B is next
    # from there on they alternate until A is done, then B finishes alone
    tail = steps[first_b:]
    a_left = steps[first_b:].count("A")
    assert tail[: 2 * a_left] == ["B", "A"] * a_left


def test_release_of_an_unheld_lock_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        FairLock().release()


def test_conversations_of_one_engine_share_one_fair_lock() -> None:
    engine = tiny_engine()
    first, second = LocalLLM(engine), LocalLLM(engine)
    assert isinstance(engine_lock(engine), FairLock)
    assert first._lock is second._lock is engine_lock(engine)


class RecordingConversation:
    """An engine conversation that notes, under the engine lock, whose block is being made (and takes 10 ms
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
