"""Helpers for tests and benchmarks that start a server on loopback: a free port, waiting until it is
healthy, stopping it."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_healthy(
    url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0, path: str = "/health"
) -> None:
    """Polls `url` + `path` (the engine server's /health; the gateway's is /healthz) until it answers 200;
    fails the test with the server's log otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}{path}", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"the server was not healthy after {timeout_s} s:\n{log.read_text()}")


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """Terminates `process` and waits for it; kills it when it has not exited within `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
