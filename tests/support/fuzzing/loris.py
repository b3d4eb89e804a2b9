"""Slow-loris against either server: sockets that send a request a byte at a time, or never finish its
headers or its body; the report says which were answered (and how) and which were still open."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.support.fuzzing.engine_server import ENGINE_KEY


@dataclass
class LorisReport:
    opened: int = 0
    answered: list[str] = field(default_factory=list)  # the first line of each answer (e.g. "HTTP/1.1 408")
    still_open: int = 0


async def _loris(
    host: str, port: int, request: bytes, stop_after: int, delay_s: float, report: LorisReport
) -> None:
    """Sends `request` one byte at a time, `delay_s` apart, stopping after `stop_after` bytes (never
    finishing), then waits for the server's answer or close."""
    reader, writer = await asyncio.open_connection(host, port)
    report.opened += 1
    try:
        for byte in request[:stop_after]:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(delay_s)
        answer = await reader.read(200)
        report.answered.append(answer.split(b"\r\n", 1)[0].decode(errors="replace") or "(closed)")
    except (ConnectionError, OSError):
        report.answered.append("(reset)")
    except asyncio.CancelledError:
        report.still_open += 1
        raise
    finally:
        writer.close()


def loris_requests(host: str, paths: Sequence[str]) -> list[tuple[bytes, int]]:
    """(request, bytes to send of it): a request that never finishes its headers, and POSTs to `paths`
    whose bodies never finish."""

    def post(path: str) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {ENGINE_KEY}\r\nContent-Length: 2000\r\n\r\n"
            '{"type": "offer", '
        ).encode()

    headers_only = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nX-Slow: ".encode() + b"a" * 50
    return [(headers_only, len(headers_only)), *((post(path), len(post(path))) for path in paths)]


async def slow_loris(
    host: str, port: int, paths: Sequence[str], n: int, delay_s: float, hold_s: float
) -> LorisReport:
    """`n` slow-loris connections for `hold_s` seconds; the report says which were answered."""
    report = LorisReport()
    requests = loris_requests(f"{host}:{port}", paths)
    tasks = [
        asyncio.create_task(_loris(host, port, *requests[i % len(requests)], delay_s, report))
        for i in range(n)
    ]
    await asyncio.wait(tasks, timeout=hold_s)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return report
