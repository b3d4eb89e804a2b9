"""The CPU lane: speech jobs (ASR, TTS) start at once, and a local engine's next forward waits for them."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

from tests.fakes import tiny_engine
from tests.voiceagent.test_llm_turns import RecordingConversation
from voiceagent.cpu_lane import NO_LANE, CpuLane
from voiceagent.llm import LocalLLM, ReplyOptions, engine_lane


def test_the_engine_waits_while_a_speech_job_runs() -> None:
    lane, order = CpuLane(), []
    started = threading.Event()

    def speech() -> None:
        started.set()
        time.sleep(0.2)
        order.append("speech done")

    job = threading.Thread(target=lane.run, args=(speech,))
    job.start()
    started.wait()
    lane.wait_turn()
    order.append("engine forward")
    job.join()
    assert order == ["speech done", "engine forward"]
    assert not lane.busy()


def test_a_speech_job_never_waits_for_the_engine() -> None:
    lane = CpuLane()
    ticket = lane.begin()  # e.g. a phrase's TTS, begun in the event loop
    assert lane.run(lambda: "transcript") == "transcript"  # a second speech job runs at once
    waited = threading.Thread(target=lane.wait_turn)
    waited.start()
    waited.join(0.1)
    assert waited.is_alive()  # the engine still waits for the first job
    lane.end(ticket)
    waited.join(2)
    assert not waited.is_alive()


def test_jobs_begun_while_the_engine_waits_do_not_lengthen_its_wait() -> None:
    """Many sessions' partials overlapping: the engine waits for the jobs running when it asked, not for
    every job after them (it would starve)."""
    lane = CpuLane()
    first = lane.begin()
    waited = threading.Thread(target=lane.wait_turn)
    waited.start()
    second = lane.begin()  # begun while the engine waits
    lane.end(first)
    waited.join(2)
    assert not waited.is_alive() and lane.busy()  # the engine's forward starts beside the second job
    lane.end(second)


def test_without_a_lane_nothing_waits() -> None:
    ticket = NO_LANE.begin()
    NO_LANE.wait_turn(timeout_s=30)  # returns at once
    NO_LANE.end(ticket)
    assert not NO_LANE.active and not NO_LANE.busy()


def test_a_cpu_engine_has_a_lane_its_forwards_wait_for_between_layers() -> None:
    engine = tiny_engine()
    lane = engine_lane(engine)
    assert lane.active and engine.draft is not None
    for model in (engine.target, engine.draft):
        hook = model.between_layers
        assert isinstance(hook, functools.partial) and hook.args == (lane.pause_point,)  # timed by the engine
    assert not engine_lane(None).active


def test_a_forward_in_flight_holds_between_layers_for_a_speech_job_begun_meanwhile() -> None:
    """A partial transcript falls due while the engine is mid-forward (a prefill of the user's words): the
    forward holds at its next layer until the partial is done, instead of sharing the cores with it."""
    engine = tiny_engine()
    lane = engine_lane(engine)
    n_layers = len(engine.target.blocks)
    layers_run: list[int] = []
    job: list[int] = []
    pause = engine.target.between_layers
    assert pause is not None

    def hook() -> None:
        layers_run.append(len(layers_run) + 1)
        if len(layers_run) == 1:
            job.append(lane.begin())  # the partial begins while layer 1 has run
        pause()

    engine.target.between_layers = hook
    conversation = engine.new_conversation()
    forward = threading.Thread(target=conversation.prefill, args=([1, 2, 3, 4, 5],))
    forward.start()
    forward.join(0.3)
    assert forward.is_alive() and layers_run == [1]  # held after layer 1 while the partial runs
    lane.end(job[0])
    forward.join(5)
    assert not forward.is_alive() and len(layers_run) == n_layers - 1
    assert conversation.target.valid == 4  # the prefill completed: every layer ran


def test_a_job_holds_the_engine_between_layers_once_at_most() -> None:
    """A stuck job (a synthesiser that never returns) holds a forward once, up to MAX_ENGINE_WAIT_S, not at
    every layer after; a job the engine already waited for before the forward does not hold it again."""
    lane = CpuLane()
    stuck = lane.begin()
    held = threading.Thread(target=lane.pause_point)
    held.start()
    held.join(0.2)
    assert held.is_alive()  # held for the job begun
    lane.end(stuck)
    held.join(2)
    waited = lane.begin()
    lane.wait_turn(timeout_s=0.01)  # the engine gave up on it before its forward
    for _ in range(28):  # the forward's layers: none holds for it again
        lane.pause_point()
    assert lane.busy()
    lane.end(waited)


def test_the_next_block_waits_for_the_phrase_its_predecessor_ended() -> None:
    """The engine's worker lets the event loop run what a block set going before its next block: a
    phrase's TTS begun there runs alone, and the next block is made after it."""
    from tests.gateway.drops import ChatTokenizer

    engine = tiny_engine()
    engine.tokenizer = ChatTokenizer()
    order: list[str] = []
    lane = engine_lane(engine)
    llm = LocalLLM(
        engine, conversation=RecordingConversation(engine.new_conversation(), "block", order), lane=lane
    )

    def render(n: int, ticket: int) -> None:
        time.sleep(0.05)
        order.append(f"phrase {n}")
        lane.end(ticket)

    async def reply() -> None:
        n = 0
        async for _ in llm.stream([{"role": "user", "content": "hello"}], ReplyOptions(max_tokens=6)):
            n += 1
            ticket = lane.begin()  # as the replier does when a block ends a phrase
            threading.Thread(target=render, args=(n, ticket)).start()
        await asyncio.sleep(0.2)

    asyncio.run(reply())
    blocks = [i for i, name in enumerate(order) if name == "block"]
    assert len(blocks) >= 3
    for k, (this, following) in enumerate(zip(blocks, blocks[1:], strict=False), start=1):
        assert f"phrase {k}" in order[this:following], order  # each phrase before the next block


def test_a_session_recognises_and_speaks_as_speech_jobs_of_its_lane() -> None:
    from tests.fakes import FakeRecognizer, FakeSynthesizer
    from tests.voiceagent.test_session import one_turn, run
    from voiceagent.events import TurnEnded

    lane = CpuLane()
    seen: list[tuple[str, bool]] = []

    class Recognizer(FakeRecognizer):
        def decode_partial(self):  # type: ignore[no-untyped-def]
            seen.append(("partial", lane.busy()))
            return super().decode_partial()

        def decode_final(self, trailing_silence_ms: float = 0.0) -> str:
            seen.append(("final", lane.busy()))
            return super().decode_final(trailing_silence_ms)

    class Synthesizer(FakeSynthesizer):
        def synthesize(self, text: str):  # type: ignore[no-untyped-def]
            for chunk in super().synthesize(text):
                seen.append(("tts", lane.busy()))
                yield chunk

    h = run(one_turn, recognizer=Recognizer(), synthesizer=Synthesizer(), lane=lane)
    assert h.of(TurnEnded) and not lane.busy()
    assert {kind for kind, _ in seen} == {"partial", "final", "tts"}
    assert all(busy for _, busy in seen), seen  # the engine would have waited for each of them
