"""Every forward runs on the process's one engine thread, whichever thread asks (engine/engine_thread.py):
spread over many threads, the same forwards ran slower in a voice session."""

import threading
from collections.abc import Iterator

import pytest

from engine import turn_end
from engine.engine_thread import ENGINE_THREAD, EngineThread
from engine.generate import CommittedBlock
from engine.sampling import SamplingParams
from tests.fakes import tiny_engine


def test_calls_run_in_order_on_one_thread_with_their_results_and_errors() -> None:
    worker = EngineThread("test-engine")
    seen: list[tuple[int, threading.Thread]] = []

    def note(i: int) -> int:
        seen.append((i, threading.current_thread()))
        return i * i

    futures = [worker.submit(note, i) for i in range(20)]
    assert [future.result(5) for future in futures] == [i * i for i in range(20)]
    assert [i for i, _ in seen] == list(range(20))
    assert len({thread for _, thread in seen}) == 1 and seen[0][1] is not threading.current_thread()

    with pytest.raises(ZeroDivisionError):
        worker.run(lambda: 1 / 0)
    assert worker.run(note, 3) == 9  # the thread goes on after a call that raised


def test_a_call_made_on_the_engine_thread_runs_at_once() -> None:
    worker = EngineThread("test-engine")
    assert worker.run(lambda: worker.run(lambda: "nested")) == "nested"  # no deadlock
    assert worker.run(worker.is_current) and not worker.is_current()


def test_iterate_makes_each_item_on_the_thread_and_closes_the_generator_there() -> None:
    worker = EngineThread("test-engine")
    threads: list[threading.Thread] = []
    closed: list[threading.Thread] = []

    def items() -> Iterator[int]:
        try:
            for i in range(5):
                threads.append(threading.current_thread())
                yield i
        finally:
            closed.append(threading.current_thread())

    stream = worker.iterate(items())
    assert [next(stream), next(stream)] == [0, 1]
    stream.close()  # type: ignore[attr-defined]
    assert set(threads + closed) == {worker.run(threading.current_thread)}
    assert list(worker.iterate(iter([]))) == []


def ids_of(blocks: Iterator[CommittedBlock]) -> list[int]:
    return [t for block in blocks for t in block.token_ids]


def test_every_forward_of_a_conversation_runs_on_the_engine_thread_whoever_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_template = turn_end.TurnMarks(end_of_turn_id=1, mark_ids=((2,),))  # the tiny tokenizer has none
    monkeypatch.setattr(turn_end, "turn_marks", lambda _: no_template)
    engine = tiny_engine("qwen2-bias", seed=3, init_std=0.1, draft_noise=0.15)
    forwards: list[threading.Thread] = []
    engine.pause_between_layers(lambda: forwards.append(threading.current_thread()))
    prompt = [5, 17, 33, 2, 9, 40, 41]
    results: dict[str, object] = {}

    def on_a_thread(name: str, call: object) -> None:
        thread = threading.Thread(target=lambda: results.__setitem__(name, call()))  # type: ignore[operator]
        thread.start()
        thread.join(60)

    conversation = engine.new_conversation()
    on_a_thread("prefill", lambda: conversation.prefill(prompt[:5]))
    on_a_thread("score", lambda: conversation.end_of_turn_probability(prompt[:6]))
    params = SamplingParams(max_new_tokens=12)
    on_a_thread("reply", lambda: ids_of(conversation.generate(prompt, params, gamma=3)))
    on_a_thread("fork", lambda: conversation.fork().tokens)
    expected = ids_of(engine.new_conversation().generate(prompt, params, gamma=0))

    assert results["prefill"] == 0 and results["score"] is not None and results["reply"] == expected
    assert results["fork"] == prompt + expected
    assert set(forwards) == {ENGINE_THREAD.run(threading.current_thread)}
