"""One fuzzing round over every target: both servers in processes of their own (logs captured), the
healthy clients alone, then again while the plan's messages and slow-loris connections hit the servers.

A crash is a server process exiting; an unhandled exception is a "Traceback", "Exception in ASGI
application" or an ERROR line in its log (`log_faults`)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.fuzzing.engine_server import fuzz_engine, healthy_completions
from tests.support.fuzzing.gateway import check_refusals, fuzz_gateway, healthy_turns
from tests.support.fuzzing.loris import LorisReport, slow_loris
from tests.support.fuzzing.tally import Pacer, Plan, Progress, Tally, TurnTimes, log_faults
from tests.support.servers import free_port, stop_process, wait_until_healthy
from voiceagent.replay.stats import latency_summary

ROOT = Path(__file__).resolve().parents[3]  # the repository


@dataclass
class ServerProcess:
    """A fuzz target in a process of its own; `log()` is everything it wrote; `alive` until it crashed."""

    kind: str  # "gateway" | "engine"
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def server_process(
    kind: str, log_dir: Path, settings: dict[str, str] | None = None, timeout_s: float = 120.0
) -> Iterator[ServerProcess]:
    """Starts `python -m tests.support.fuzzing.targets KIND --port P` and waits until it answers; stops it
    afterwards."""
    port = free_port()
    log_path = log_dir / f"{kind}-{port}.log"
    command = [sys.executable, "-m", "tests.support.fuzzing.targets", kind, "--port", str(port)]
    command += [f"--set={name}={value}" for name, value in (settings or {}).items()]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(kind, port, log_path, process)
    try:
        path = "/healthz" if kind == "gateway" else "/health"
        wait_until_healthy(f"http://{server.url}", process, log_path, timeout_s, path)
        yield server
    finally:
        stop_process(process)


@contextlib.contextmanager
def in_thread(work: Callable[[threading.Event], Coroutine[Any, Any, None]]) -> Iterator[None]:
    """Runs `work(stop)` on an event loop in a thread of its own while the block runs (the healthy clients:
    the fuzzing's own load on this process's loop does not delay their measurements); then sets `stop`,
    waits for it, and raises what it raised."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(work(stop))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            errors.append(error)

    thread = threading.Thread(target=target, name="healthy-client", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
    if errors:
        raise errors[0]


@dataclass
class RoundResult:
    """One fuzzing round: the tally, the healthy clients before and during it, the servers' state."""

    tally: Tally
    baseline: dict[str, TurnTimes]
    during: dict[str, TurnTimes]
    loris: dict[str, LorisReport]
    alive: dict[str, bool]
    log_faults: dict[str, list[str]]
    seconds: float

    def summary(self) -> dict[str, Any]:
        def times(phase: dict[str, TurnTimes]) -> dict[str, Any]:
            return {
                "ws_turn_server_ms": latency_summary(phase["ws"].server_ms),
                "ws_turn_client_ms": latency_summary(phase["ws"].client_ms),
                "ws_failed_turns": phase["ws"].failed,
                "engine_request_ms": latency_summary(phase["engine"].client_ms),
                "engine_failed_requests": phase["engine"].failed,
            }

        return {
            **self.tally.summary(),
            "crashes": sum(not alive for alive in self.alive.values()),
            "log_faults": {name: len(lines) for name, lines in self.log_faults.items()},
            "first_log_faults": [line for lines in self.log_faults.values() for line in lines][:10],
            "baseline": times(self.baseline),
            "during": times(self.during),
            "slow_loris": {
                name: {"opened": r.opened, "answered": Counter(r.answered), "still_open": r.still_open}
                for name, r in self.loris.items()
            },
            "seconds": round(self.seconds, 1),
        }


# Room for the WebRTC offers the fuzzing gets answered: each holds its session until ICE gives up (20 s).
GATEWAY_SETTINGS = {"max_sessions": "1000", "max_message_bytes": "65536"}


def fuzz_round(
    plan: Plan,
    log_dir: Path,
    baseline_s: float,
    loris_hold_s: float,
    progress: Progress,
    engine_settings: dict[str, str] | None = None,
) -> RoundResult:
    """Both servers in their own processes; the healthy clients alone for `baseline_s`, then again while
    the plan's messages and `plan.loris` slow-loris connections hit the same servers."""
    began = time.monotonic()
    settings = {**GATEWAY_SETTINGS, "max_message_bytes": str(plan.limit)}
    with (
        server_process("gateway", log_dir, settings) as gateway,
        server_process("engine", log_dir, engine_settings) as engine,
    ):

        def healthy(times: dict[str, TurnTimes]) -> contextlib.ExitStack:
            stack = contextlib.ExitStack()
            stack.enter_context(
                in_thread(lambda stop: healthy_turns(f"ws://{gateway.url}/ws", stop, times["ws"]))
            )
            stack.enter_context(
                in_thread(lambda stop: healthy_completions(f"http://{engine.url}", stop, times["engine"]))
            )
            return stack

        baseline = {"ws": TurnTimes(), "engine": TurnTimes()}
        with healthy(baseline):
            time.sleep(baseline_s)
        during = {"ws": TurnTimes(), "engine": TurnTimes()}
        tally, loris = Tally(pacer=Pacer(plan.rate)), {}
        with healthy(during):
            loris = asyncio.run(_fuzz_all(gateway, engine, plan, tally, progress, loris_hold_s))
        alive = {"gateway": gateway.alive, "engine": engine.alive}
    faults = {"gateway": log_faults(gateway.log()), "engine": log_faults(engine.log())}
    return RoundResult(tally, baseline, during, loris, alive, faults, time.monotonic() - began)


async def _fuzz_all(
    gateway: ServerProcess, engine: ServerProcess, plan: Plan, tally: Tally, progress: Progress, hold_s: float
) -> dict[str, LorisReport]:
    # per byte: 20 ms, so the headers are sent within ~4 s; the bodies then wait for the servers' timeouts
    gateway_loris = slow_loris(
        "127.0.0.1", gateway.port, ["/twilio/voice", "/webrtc/offer"], plan.loris // 2, 0.02, hold_s
    )
    engine_loris = slow_loris(
        "127.0.0.1", engine.port, ["/v1/chat/completions"], plan.loris // 2, 0.02, hold_s
    )
    reports = await asyncio.gather(
        gateway_loris,
        engine_loris,
        fuzz_gateway(gateway.url, plan, tally, progress),
        fuzz_engine(engine.url, plan, tally, progress),
        check_refusals(gateway.url, tally),
    )
    return {"gateway": reports[0], "engine": reports[1]}
