"""Crash safety: `kill -9` of a server mid-conversation loses nothing already written, and a restart on the
same port and trace folder serves again. The server is tests/gateway/fake_server.py (fake stages), with
traces and input-audio recording on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile
from websockets.asyncio.client import connect

from tests.gateway.helpers import client, quiet, tone
from tests.gateway.twilio_sim import RATE, TwilioCaller
from tests.support.servers import free_port, wait_until_healthy


@contextlib.contextmanager
def fake_server(port: int, trace_dir: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """tests/gateway/fake_server.py on `port`, tracing and recording into `trace_dir`; killed at the end."""
    env = {**os.environ, "VOICEAGENT_TRACE_DIR": str(trace_dir), "VOICEAGENT_RECORD_AUDIO": "1"}
    command = [sys.executable, "-m", "tests.gateway.fake_server", "--port", str(port), "--words", "30"]
    with log.open("a") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, log, timeout_s=60.0, path="/healthz")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


async def until_both_traces_reach_turn_2(traces: Path, timeout_s: float = 15.0) -> None:
    """Polls the trace files (flushed per line) until both sessions have written a turn-2 record."""
    async with asyncio.timeout(timeout_s):
        while True:
            files = list(traces.glob("*.jsonl"))  # noqa: ASYNC240 - a test's polling loop
            texts = [path.read_text() for path in files]  # noqa: ASYNC240
            if len(texts) == 2 and all('"turn": 2' in text for text in texts):
                return
            await asyncio.sleep(0.05)


async def talk_until_killed(host: str, process: subprocess.Popen[bytes], traces: Path) -> None:
    """A /ws session and a phone call, both mid-reply and speaking again (turn 2 in both traces), when the
    server is killed."""
    start = {"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}}
    async with client(host) as web, connect(f"ws://{host}/twilio") as phone_ws:
        phone = TwilioCaller(phone_ws)
        await phone.connect_and_start()
        await web.send_json(start)
        await web.event("session.started")
        await asyncio.gather(
            web.stream(np.concatenate([tone(0.6, 16000), quiet(0.4, 16000)]), 16000),
            phone.say(np.concatenate([tone(0.6, RATE), quiet(0.4, RATE)])),
        )
        await web.event("agent.audio.start")  # the agent is speaking to both
        await phone.wait(lambda: phone.media_bytes > 0)
        # both speak over the agent; the server dies while it records their audio
        speaking = asyncio.gather(web.stream(tone(2.0, 16000), 16000), phone.say(tone(2.0, RATE)))
        await until_both_traces_reach_turn_2(traces)
        await asyncio.sleep(0.2)  # a few more frames of turn 2 recorded
        os.kill(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):  # sending into a dead server fails: expected
            await speaking
        assert (await web.closed_with()) == (1006, "")  # no close frame: the process is gone
        await phone.wait(lambda: phone.closed is not None)
        for task in phone._tasks:
            task.cancel()


async def one_turn(host: str) -> dict[str, object]:
    async with client(host) as c:
        await c.send_json({"type": "session.start", "audio": {"encoding": "pcm16", "sample_rate": 16000}})
        await c.event("session.started")
        await c.stream(np.concatenate([tone(0.6, 16000), quiet(0.4, 16000)]), 16000)
        metrics = await c.event("turn.metrics", timeout_s=15)
        await c.send_json({"type": "session.end"})
        assert await c.closed_with() == (1000, "session ended")
        return metrics


def trace_records(path: Path) -> list[dict[str, object]]:
    text = path.read_text()
    assert text.endswith("\n"), f"{path.name} ends in a partial line"
    return [json.loads(line) for line in text.splitlines()]  # every line is whole JSON


def test_a_killed_server_leaves_whole_traces_and_playable_audio_and_restarts(tmp_path: Path) -> None:
    port, traces, log = free_port(), tmp_path / "traces", tmp_path / "server.log"
    host = f"127.0.0.1:{port}"
    with fake_server(port, traces, log) as process:
        asyncio.run(talk_until_killed(host, process, traces))
        assert process.wait(10) == -signal.SIGKILL
    before = sorted(traces.glob("*.jsonl"))
    assert len(before) == 2
    for path in before:
        records = trace_records(path)
        events = [r["event"] for r in records]
        assert events[0] == "session.start" and "session.end" not in events  # killed, not closed
        assert "out.first_audio" in events and "rec.audio" in events
        assert max(int(str(r["turn"])) for r in records) == 2  # the second utterance had started
        wavs = sorted(path.with_suffix(".audio").glob("*.wav"))
        assert [w.name[:8] for w in wavs][-1] == "turn-002", wavs
        for wav in wavs:
            samples, rate = soundfile.read(wav, dtype="int16")
            assert rate == 16000 and len(samples) > 0, wav
        last, _ = soundfile.read(wavs[-1], dtype="int16")
        assert np.abs(last.astype(np.int32)).max() > 1000, "the interrupted speech is in the last file"
        recorded = {str(r["file"]) for r in records if r["event"] == "rec.audio"}
        assert {f"{w.parent.name}/{w.name}" for w in wavs} == recorded
    sizes = {path: path.stat().st_size for path in before}

    with fake_server(port, traces, log):  # the same port and trace folder
        metrics = asyncio.run(one_turn(host))
    assert metrics["outcome"] == "done"
    after = sorted(traces.glob("*.jsonl"))
    assert len(after) == 3 and {path: path.stat().st_size for path in before} == sizes
    new = trace_records(next(path for path in after if path not in before))
    assert [r["event"] for r in new][-1] == "session.end"
