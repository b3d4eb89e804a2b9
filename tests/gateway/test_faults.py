"""Faults and limits through /ws on fake stages: an LLM that raises or stalls (also the local engine's
LocalLLM on a stalled engine) fails only its turn; utterances, replies and sessions past their length
limits end with a clear error and reason; a model that does not load stops `voiceagent serve`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from engine.fair_lock import FairLock
from engine.metrics import BlockTiming
from tests.fakes import FakePipeline
from tests.gateway.helpers import Client, client, fake_app, quiet, running, tone
from tests.gateway.test_webrtc import build
from tests.gateway.twilio_sim import TwilioCaller
from tests.support.fuzzing import FuzzTokenizer
from voiceagent.gateway.webrtc_peer import WebRtcPeer
from voiceagent.llm import LocalLLM, ReplyBlock
from voiceagent.session import Session

ROOT = Path(__file__).resolve().parents[2]


def start(rate: int = 16000) -> dict[str, object]:
    return {"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": rate}}


async def started(c: Client) -> None:
    await c.send_json(start())
    await c.event("session.started")


async def typed_turn(c: Client, text: str) -> dict[str, Any]:
    """Types `text` and returns the turn's turn.metrics (or the error that ended it, then its metrics)."""
    after = len(c.events)
    await c.send_json({"type": "input.text", "text": text})
    return await c.event("turn.metrics", after=after)


class FlakyLLM:
    """Per reply, in turn: raises, stalls forever, answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, messages: Any, options: Any = None) -> AsyncIterator[ReplyBlock]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("the engine exploded")
        if self.calls == 2:
            await asyncio.Event().wait()
        yield ReplyBlock("All good.", 1)

    async def aclose(self) -> None:
        return None


class PipelineWith(FakePipeline):
    """FakePipeline whose sessions use the LLM `make_llm()` returns."""

    def __init__(self, make_llm: Any) -> None:
        super().__init__()
        self.make_llm = make_llm

    def new_session(self, clock: Any, trace: Any, options: Any = None) -> Session:
        session: Session = super().new_session(clock, trace, options)
        session.llm = self.make_llm()
        return session


def test_a_failing_or_stalled_llm_fails_its_turn_and_the_next_turn_works() -> None:
    async def scenario() -> None:
        app, _ = fake_app(PipelineWith(FlakyLLM), max_turn_s=0.5)
        async with running(app) as host, client(host) as c:
            await started(c)
            failed = await typed_turn(c, "one")
            error = await c.event("error")
            assert (error["code"], error["stage"], error["turn"]) == ("turn_failed", "llm", 1)
            assert "the engine exploded" in error["message"] and failed["outcome"] == "error"
            stalled = await typed_turn(c, "two")
            error = await c.event("error", after=c.types().index("turn.metrics") + 1)
            assert (error["code"], error["turn"]) == ("turn_too_long", 2) and "0.5 s" in error["message"]
            assert stalled["outcome"] == "error"
            assert (await typed_turn(c, "three"))["outcome"] == "done"
            assert c.closed is None

    asyncio.run(scenario())


class Block:
    """What engine.generate.CommittedBlock gives LocalLLM."""

    def __init__(self, text: str, finish_reason: str | None) -> None:
        self.text, self.token_ids, self.finish_reason = text, [1], finish_reason
        self.n_drafted, self.n_accepted = 4, 2
        self.timing = BlockTiming(draft_s=0.01, verify_s=0.02, committed_at=0.0)


class StallingConversation:
    """The first reply sends one block and then stalls until it is cancelled (or for 10 s); later replies
    answer at once."""

    max_seq_len = 4096

    def __init__(self) -> None:
        self.replies = 0
        self.cancelled = threading.Event()

    def generate(
        self,
        prompt: Sequence[int],
        params: Any,
        cancel: threading.Event,
        proposal: Sequence[int] = (),
        plain_tokens: int = 0,
    ) -> Iterator[Block]:
        self.replies += 1
        if self.replies == 1:
            yield Block("Let me", None)
            if cancel.wait(10):
                self.cancelled.set()
                return
        yield Block("Sure.", "stop")


class StalledEngine:
    tokenizer = FuzzTokenizer(96)
    lock = FairLock()
    paused_s = 0.0  # never held between layers (no lane)


def test_a_stalled_local_engine_times_out_is_told_to_cancel_and_the_next_turn_works() -> None:
    conversation = StallingConversation()
    engine = StalledEngine()

    def local_llm() -> LocalLLM:
        return LocalLLM(engine, conversation=conversation, block_timeout_s=0.3)  # type: ignore[arg-type]

    async def scenario() -> None:
        app, _ = fake_app(PipelineWith(local_llm))
        async with running(app) as host, client(host) as c:
            await started(c)
            assert (await typed_turn(c, "hello?"))["outcome"] == "error"
            error = await c.event("error")
            assert (error["code"], error["stage"]) == ("turn_failed", "llm")
            assert "no block within 0.3 s" in error["message"]
            assert conversation.cancelled.wait(2)  # the engine's thread was told to stop
            assert (await typed_turn(c, "and now?"))["outcome"] == "done"
            assert [e["text"] for e in c.events if e["type"] == "agent.block"] == ["Let me", "Sure."]

    asyncio.run(scenario())


def test_an_utterance_over_the_turn_limit_is_cut_off_with_an_error_and_the_next_is_answered() -> None:
    async def scenario() -> None:
        app, _ = fake_app(max_turn_s=0.5)
        async with running(app) as host, client(host) as c:
            await started(c)
            await c.stream(np.concatenate([tone(1.2, 16000), quiet(0.4, 16000)]), 16000)
            error = await c.event("error")
            assert (error["code"], error["stage"], error["turn"]) == ("turn_too_long", "input", 1)
            assert "0.5 s limit" in error["message"]
            await c.stream(np.concatenate([tone(0.3, 16000), quiet(0.4, 16000)]), 16000)
            await c.wait(lambda: sum(e["type"] == "turn.metrics" for e in c.events) == 2)
            outcomes = [(e["turn"], e["outcome"]) for e in c.events if e["type"] == "turn.metrics"]
            assert outcomes == [(1, "error"), (2, "done")]
            finals = [e["turn"] for e in c.events if e["type"] == "transcript.final"]
            assert finals == [2]  # the cut-off utterance was not answered

    asyncio.run(scenario())


def test_sessions_end_at_their_length_limit_with_a_reason() -> None:
    async def scenario() -> None:
        app, _ = fake_app(max_session_s=0.5)
        async with running(app) as host:
            async with client(host) as c:
                await started(c)
                error = await c.event("error", timeout_s=5)
                assert error["code"] == "session_too_long" and "0.5 s" in error["message"]
                assert await c.closed_with() == (4410, "the session reached its 0.5 s limit")
            async with connect(f"ws://{host}/twilio") as ws:
                caller = TwilioCaller(ws)
                await caller.connect_and_start()
                await caller.wait(lambda: caller.closed is not None, timeout_s=5)
                assert caller.closed == (4410, "the call reached its 0.5 s limit")
            assert not app.state.hub.live

    asyncio.run(scenario())


def serve_with(target: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VOICEAGENT_TARGET": target, "VOICEAGENT_DRAFT": "none"}
    command = [sys.executable, "-m", "voiceagent", "serve", "--port", "1"]  # never reached
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_model_that_does_not_load_stops_serve_with_a_clear_message(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"')  # cut short
    for target, message in [
        ("no-such-model", "error: unknown model 'no-such-model'"),
        (str(broken), "is not a valid JSON file"),
    ]:
        result = serve_with(target, tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "listening" not in result.stdout + result.stderr


def test_a_webrtc_session_ends_at_its_length_limit_with_an_error_event() -> None:
    async def scenario() -> None:
        app = build(max_session_s=0.2)
        peer = WebRtcPeer(app.state.hub, app.state.hub.clock, 65536)
        await asyncio.wait_for(peer._until_ended(), 2)
        assert peer._ended.is_set()  # the peer shuts down (run() returns from _serve)
        assert [m["code"] for m in peer._unsent] == ["session_too_long"]  # sent once the channel opens
        assert "0.2 s limit" in peer._unsent[0]["message"]
        await peer.pc.close()

    asyncio.run(scenario())
