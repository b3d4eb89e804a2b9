"""llama.cpp's OpenAI-compatible server (llama-cpp-python's `llama_cpp.server`) on a GGUF, for Pipecat's LLM.

Bound to 127.0.0.1 on a free port, `threads` threads, started and stopped by the bench (a context manager).
Its extra needs fastapi, sse-starlette and starlette-context: `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

MODEL_ALIAS = "bundled-target"
SERVER_MODULES = ("fastapi", "sse_starlette", "starlette_context", "pydantic_settings", "uvicorn")


@dataclass(frozen=True)
class LlamaServer:
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the alias requests name
    process: subprocess.Popen[bytes]


def missing_server_modules() -> list[str]:
    """The modules llama_cpp.server needs that this Python lacks (empty when it can run)."""
    return [name for name in SERVER_MODULES if importlib.util.find_spec(name) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def llama_server(
    gguf: Path, threads: int, log: Callable[[str], None], n_ctx: int = 2048, timeout_s: float = 120.0
) -> Iterator[LlamaServer]:
    """Runs the server on `gguf` for the block's duration; its output goes to this process's stderr."""
    missing = missing_server_modules()
    if missing:
        raise RuntimeError(
            f"llama.cpp's server needs {', '.join(missing)}: .venv/bin/pip install -e '.[bench]' "
            "-c requirements/constraints.txt"
        )
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL_ALIAS,
        "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
        "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx), "--verbose", "False",
    ]  # fmt: skip
    log(f"llama.cpp server: {gguf.name} on 127.0.0.1:{port}, {threads} threads")
    process = subprocess.Popen(command, stdout=sys.stderr, stderr=sys.stderr)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/v1/models", process, timeout_s)
        yield LlamaServer(f"http://127.0.0.1:{port}/v1", MODEL_ALIAS, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama.cpp's server exited ({process.returncode}): see its output above")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"llama.cpp's server did not answer {url} within {timeout_s:.0f} s")
