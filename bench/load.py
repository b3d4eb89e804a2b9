"""Concurrent simulated phone calls against the gateway on fast fakes: how many it paces on time.

    .venv/bin/python -m bench.load [--calls 25,50,100,150,200,300] [--workers 2] [--turns 3]

For each N, a fresh gateway process (tests/gateway/fake_server.py: fake VAD, ASR, LLM and TTS, so the
gateway itself is measured) takes N Twilio Media Streams calls from `--workers` client processes (the
clients never share a process with the server). Each call behaves like Twilio: after `connected` and
`start` it sends a 20 ms mu-law `media` message every 20 ms for the whole call (silence when the caller is
quiet), speaks 1 s of tone per turn, plays the agent's media in real time and returns each `mark` when its
audio has played. A turn ends when the whole reply (20 words of 100 ms) has played; 0.5 s later the caller
speaks again. Calls start at random times within the first 2 s.

Lateness, per outbound media message: the gateway paces a reply at most LEAD (200 ms) ahead of playback,
so on the reply's schedule message k, which starts at sample s_k of the reply, is due at
`due_k = t0 + max(0, s_k / 8000 - 0.2)` seconds, where t0 is the arrival of the reply's first media
message at the caller. lateness_k = arrival_k - due_k (clock of the caller's process). An underrun is a
message that arrives after the caller finished playing everything before it (an audible gap).
The caller's own event-loop lag is measured too (a 20 ms ticker), to show the clients keep up, and the
gateway's CPU time and its run-queue wait (time runnable but not running: the machine had no free core).

Progress goes to stderr; the LAST line on stdout is one JSON object with a row per N and the knee: the
largest N whose p99 lateness is <= 20 ms with every call complete.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from tests.support.servers import stop_process, wait_until_healthy
from voiceagent.audio import mulaw_encode
from voiceagent.replay.stats import percentile, rounded

RATE = 8000
FRAME_S = 0.02
LEAD_S = 0.2  # voiceagent/gateway/twilio.py LEAD_MS
REPLY_WORDS, WORD_MS = 20, 100
REPLY_SAMPLES = REPLY_WORDS * WORD_MS * RATE // 1000
SPEECH_FRAMES = 50  # 1 s of tone per turn
GOAL_MS = 20.0
RAMP_S = 2.0
SERVER_ARGS: list[str] = []  # more fake_server options (--server-args)


# ----- one caller ----------------------------------------------------------------------------------------


def _media_templates() -> tuple[list[str], str]:
    """Base64 payloads: 50 frames of a 440 Hz tone (speech to the fake VAD), and one of silence."""
    t = np.arange(SPEECH_FRAMES * 160) / RATE
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    speech = [
        base64.b64encode(mulaw_encode(tone[i * 160 : (i + 1) * 160])).decode() for i in range(SPEECH_FRAMES)
    ]
    return speech, base64.b64encode(mulaw_encode(np.zeros(160, np.int16))).decode()


SPEECH, SILENCE = _media_templates()


@dataclass
class CallStats:
    lateness_ms: list[float] = field(default_factory=list)
    response_ms: list[float] = field(default_factory=list)  # end of the caller's speech -> first media
    underruns: int = 0
    turns_done: int = 0
    media: int = 0
    error: str | None = None


class Call:
    """A Twilio-like caller: media every 20 ms (sent by the worker's ticker), playback, marks returned."""

    def __init__(self, ws: ClientConnection, sid: str, turns: int) -> None:
        self.ws, self.sid, self.turns = ws, sid, turns
        self.stats = CallStats()
        self.sequence = 0
        self.speaking_frames = SPEECH_FRAMES  # frames left to speak in this turn (0: quiet)
        self.speech_end = 0.0
        self.turn_t0: float | None = None  # arrival of this reply's first media
        self.turn_samples = 0  # samples of this reply received
        self.play_end = 0.0  # when the caller finishes playing what it has received
        self.quiet_until = 0.0  # the pause before speaking again
        self.finished = False  # every turn played; the caller hangs up
        self.done = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    def next_message(self, now: float) -> str:
        self.sequence += 1
        if self.speaking_frames > 0 and now >= self.quiet_until:
            payload = SPEECH[SPEECH_FRAMES - self.speaking_frames]
            self.speaking_frames -= 1
            if self.speaking_frames == 0:
                self.speech_end = now + FRAME_S
        else:
            payload = SILENCE
        return (f'{{"event":"media","sequenceNumber":"{self.sequence}","streamSid":"{self.sid}","media":'
                f'{{"track":"inbound","chunk":"{self.sequence}","timestamp":"{20 * self.sequence}",'
                f'"payload":"{payload}"}}}}')  # fmt: skip

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for raw in self.ws:
                now = time.monotonic()
                message = json.loads(raw)
                event = message.get("event")
                if event == "media":
                    self._media(now, len(message["media"]["payload"]) * 3 // 4)
                elif event == "mark":
                    name = message["mark"]["name"]
                    loop.call_at(self.play_end, self._return_mark, name)
                    if int(name.split(":")[1]) >= REPLY_SAMPLES:
                        loop.call_at(self.play_end, self._turn_played)
        except Exception as error:  # noqa: BLE001 - recorded: the run reports failed calls
            if not self.finished:
                self.stats.error = f"{type(error).__name__}: {error}"
        self.done.set()

    def _media(self, now: float, n_samples: int) -> None:
        stats = self.stats
        stats.media += 1
        if self.turn_t0 is None:
            self.turn_t0, self.turn_samples, self.play_end = now, 0, now
            stats.response_ms.append(1000 * (now - self.speech_end))
        due = self.turn_t0 + max(0.0, self.turn_samples / RATE - LEAD_S)
        stats.lateness_ms.append(1000 * (now - due))
        if self.turn_samples and now > self.play_end:
            stats.underruns += 1
        self.play_end = max(now, self.play_end) + n_samples / RATE
        self.turn_samples += n_samples

    def _return_mark(self, name: str) -> None:
        mark = json.dumps({"event": "mark", "streamSid": self.sid, "mark": {"name": name}})
        asyncio.ensure_future(self._send(mark))

    def _turn_played(self) -> None:
        self.stats.turns_done += 1
        self.turn_t0 = None
        if self.stats.turns_done >= self.turns:
            self.finished = True
            asyncio.ensure_future(self.ws.close())
            return
        self.quiet_until = time.monotonic() + 0.5
        self.speaking_frames = SPEECH_FRAMES

    async def _send(self, message: str) -> None:
        try:
            await self.ws.send(message)
        except Exception as error:  # noqa: BLE001
            if not self.finished:  # a mark still due when the caller hung up is no failure
                self.stats.error = self.stats.error or f"{type(error).__name__}: {error}"


async def open_call(host: str, index: int, turns: int) -> Call:
    ws = await connect(f"ws://{host}/twilio", compression=None, open_timeout=30, max_queue=None)
    sid = f"MZ{index:032d}"
    await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
    media_format = {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}
    start = {"streamSid": sid, "accountSid": "AC0", "callSid": f"CA{index}", "tracks": ["inbound"],
             "mediaFormat": media_format, "customParameters": {}}  # fmt: skip
    await ws.send(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": sid, "start": start}))
    return Call(ws, sid, turns)


# ----- a client process --------------------------------------------------------------------------------


async def worker(
    host: str, first: int, n_calls: int, turns: int, start_at: float, seed: int
) -> dict[str, Any]:
    """Runs `n_calls` calls from one process; one 20 ms ticker sends every call's media."""
    rng = random.Random(seed)
    calls: list[Call] = []
    lags: list[float] = []
    offsets = sorted(rng.uniform(0, RAMP_S) for _ in range(n_calls))
    await asyncio.sleep(max(0.0, start_at - time.time()))
    started = time.monotonic()
    pending = list(enumerate(offsets))
    tick = started
    deadline = started + RAMP_S + turns * 8.0 + 20.0
    while time.monotonic() < deadline:
        tick += FRAME_S
        delay = tick - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.monotonic()
        lags.append(1000 * (now - tick))
        while pending and pending[0][1] <= now - started:
            i, _ = pending.pop(0)
            calls.append(await open_call(host, first + i, turns))
        live = [call for call in calls if not call.done.is_set() and not call.finished]
        if not pending and not live:
            break
        for call in live:
            await call._send(call.next_message(now))
        if now - tick > 1.0:  # far behind: skip ahead rather than burst
            tick = now
    for call in calls:
        if not call.done.is_set() and not call.finished:
            call.stats.error = call.stats.error or (
                f"did not finish in time: {call.stats.turns_done} turns played, {call.turn_samples} samples "
                f"of this reply, {call.speaking_frames} speech frames left, {call.stats.media} media in all"
            )
            await call.ws.close()
    return {"calls": [asdict(call.stats) for call in calls], "loop_lag_ms": lags}


def worker_main(args: argparse.Namespace) -> None:
    result = asyncio.run(worker(args.host, args.first, args.n_calls, args.turns, args.start_at, args.seed))
    print(json.dumps(result))


# ----- the gateway's cost of one inbound media message ----------------------------------------------


async def _flood(host: str, index: int, messages: int) -> None:
    """One call that sends `messages` silent media messages back to back, then stops."""
    async with connect(f"ws://{host}/twilio", compression=None, open_timeout=30) as ws:
        sid = f"MZ{index:032d}"
        media_format = {"encoding": "audio/x-mulaw", "sampleRate": RATE, "channels": 1}
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        start = {"streamSid": sid, "mediaFormat": media_format}
        await ws.send(json.dumps({"event": "start", "streamSid": sid, "start": start}))
        media = f'{{"event":"media","streamSid":"{sid}","media":{{"track":"inbound","payload":"{SILENCE}"}}}}'
        for i in range(messages):
            await ws.send(media)
            if i % 50 == 0:
                await asyncio.sleep(0.001)
        await ws.send(json.dumps({"event": "stop", "streamSid": sid}))
        await ws.wait_closed()


def inbound_cost(calls: int, messages: int, port: int) -> dict[str, Any]:
    """Gateway CPU per inbound media message, sent back to back by `calls` calls (no replies: silence)."""
    server = start_server(port, calls + 10, Path("/tmp/voiceagent-load-server.log"), None)
    try:
        before = cpu_seconds(server.pid)

        async def flood_all() -> None:
            await asyncio.gather(*(_flood(f"127.0.0.1:{port}", i, messages) for i in range(calls)))

        asyncio.run(flood_all())
        used = cpu_seconds(server.pid) - before
    finally:
        stop_process(server, 30.0)
    return {"inbound_messages": calls * messages, "server_cpu_s": round(used, 2),
            "us_per_message": round(1e6 * used / (calls * messages), 1)}  # fmt: skip


# ----- the conductor -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_queue_wait_seconds(pid: int) -> float:
    """Seconds the process's threads have waited, runnable, for a CPU (/proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def start_server(port: int, max_sessions: int, log: Path, profile: Path | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VOICEAGENT_MAX_SESSIONS": str(max_sessions), "VOICEAGENT_IDLE_TIMEOUT_S": "120"}
    command = [sys.executable, "-m", "tests.gateway.fake_server", "--port", str(port),
               "--words", str(REPLY_WORDS), "--word-ms", str(WORD_MS), "--chunker", "phrase"]  # fmt: skip
    if profile is not None:
        command += ["--profile", str(profile)]
    command += SERVER_ARGS
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", server, log, timeout_s=60.0, path="/healthz")
    except BaseException:  # pytest's failure outcome is not an Exception
        server.kill()
        raise
    return server


def _ms_at(values: list[float], q: float) -> float | None:
    """The q-th percentile of `values` (ms), to 0.1 ms."""
    return rounded(percentile(values, q), 1)


def run_level(n: int, workers: int, turns: int, port: int, log: Path, profile: Path | None) -> dict[str, Any]:
    server = start_server(port, n + 10, log, profile and profile / f"server-{n}.prof")
    try:
        start_at = time.time() + 1.5
        shares = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
        firsts = [sum(shares[:i]) for i in range(workers)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.load",
                    "--worker",
                    "--host",
                    f"127.0.0.1:{port}",
                    "--first",
                    str(first),
                    "--n-calls",
                    str(share),
                    "--turns",
                    str(turns),
                    "--start-at",
                    str(start_at),
                    "--seed",
                    str(first),
                ],
                stdout=subprocess.PIPE,
            )  # fmt: skip
            for first, share in zip(firsts, shares, strict=True)
            if share
        ]
        cpu_before, wall_before = cpu_seconds(server.pid), time.monotonic()
        waited_before = run_queue_wait_seconds(server.pid)
        outputs = [
            json.loads(proc.communicate(timeout=600)[0].decode().strip().splitlines()[-1]) for proc in procs
        ]
        wall = time.monotonic() - wall_before
        server_cpu = (cpu_seconds(server.pid) - cpu_before) / wall
        server_waited = (run_queue_wait_seconds(server.pid) - waited_before) / wall
    finally:
        stop_process(server, 30.0)
    calls = [call for output in outputs for call in output["calls"]]
    lateness = [v for call in calls for v in call["lateness_ms"]]
    response = [v for call in calls for v in call["response_ms"]]
    lags = [v for output in outputs for v in output["loop_lag_ms"]]
    complete = sum(1 for call in calls if call["turns_done"] >= turns and call["error"] is None)
    return {
        "calls": n,
        "complete": complete,
        "failed": [call["error"] for call in calls if call["error"]][:5],
        "media_messages": len(lateness),
        "lateness_ms": {
            "p50": _ms_at(lateness, 50),
            "p99": _ms_at(lateness, 99),
            "max": round(max(lateness), 1) if lateness else None,
        },  # fmt: skip
        "late_over_20ms": sum(1 for v in lateness if v > GOAL_MS),
        "underruns": sum(call["underruns"] for call in calls),
        "response_ms": {"p50": _ms_at(response, 50), "p95": _ms_at(response, 95)},
        "server_cpu": round(server_cpu, 2),  # CPU seconds per second (all threads)
        "server_run_queue_wait": round(server_waited, 2),  # seconds per second runnable but not running
        "client_loop_lag_ms": {"p99": _ms_at(lags, 99), "max": round(max(lags), 1) if lags else None},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--calls", default="25,50,100,150,200,300", help="concurrent calls to try, comma-separated"
    )
    parser.add_argument("--workers", type=int, default=2, help="client processes")
    parser.add_argument("--turns", type=int, default=3, help="turns per call")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--server-args", default="", help="more tests/gateway/fake_server.py options")
    parser.add_argument("--profile", type=Path, help="profile the gateway: DIR/server-N.prof (cProfile)")
    parser.add_argument(
        "--inbound-cost", action="store_true", help="only measure the gateway CPU per inbound media message"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--n-calls", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args)
        return
    from tests.support.servers import free_port

    SERVER_ARGS.extend(args.server_args.split())
    if args.inbound_cost:
        print(json.dumps(inbound_cost(20, 1500, args.port or free_port())))
        return
    rows = []
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "voiceagent-load-server.log"
    for n in [int(value) for value in args.calls.split(",")]:
        row = run_level(n, args.workers, args.turns, args.port or free_port(), log, args.profile)
        late = row["lateness_ms"]
        print(f"N={n:4d}: complete {row['complete']}/{n}, lateness p50 {late['p50']} p99 {late['p99']} "
              f"max {late['max']} ms, >20 ms {row['late_over_20ms']}/{row['media_messages']}, underruns "
              f"{row['underruns']}, response p50 {row['response_ms']['p50']} ms, "
              f"server CPU {row['server_cpu']} (waiting for a CPU {row['server_run_queue_wait']}), "
              f"client lag p99 {row['client_loop_lag_ms']['p99']} ms",
              file=sys.stderr, flush=True)  # fmt: skip
        if row["failed"]:
            print(f"        failed calls, e.g.: {row['failed'][:2]}", file=sys.stderr, flush=True)
        rows.append(row)
    good = [
        r["calls"] for r in rows if r["complete"] == r["calls"] and (r["lateness_ms"]["p99"] or 0) <= GOAL_MS
    ]
    print(json.dumps({"levels": rows, "goal_p99_ms": GOAL_MS, "knee_calls": max(good, default=0),
                      "workers": args.workers, "turns": args.turns}))  # fmt: skip


if __name__ == "__main__":
    main()
