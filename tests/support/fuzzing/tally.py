"""What a fuzzing run counts and shares: the tally of messages and answers, the pace all drivers keep,
the plan of one round, the healthy clients' times, and the marks of a fault in a server's log."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOG_FAULTS = ("Traceback", "Exception in ASGI application", "ERROR", "CRITICAL")


class Pacer:
    """Spreads the sends of every driver sharing it to `rate` a second (None: as fast as they go)."""

    def __init__(self, rate: float | None = None) -> None:
        self.rate, self._next = rate, 0.0

    async def wait(self) -> None:
        if self.rate is None:
            return
        now = time.monotonic()
        slot = max(self._next, now)
        self._next = slot + 1 / self.rate
        await asyncio.sleep(slot - now)


@dataclass
class Tally:
    """What a fuzzing run sent and how the servers answered (and the pace all drivers share)."""

    sent: Counter[str] = field(default_factory=Counter)  # messages, by target
    answered: Counter[str] = field(default_factory=Counter)  # bad messages answered as documented, by target
    bad: Counter[str] = field(default_factory=Counter)  # bad messages sent, by target
    mismatches: list[str] = field(default_factory=list)  # unexpected answers (the first 50)
    n_mismatches: int = 0
    unprocessed: Counter[str] = field(default_factory=Counter)  # sent after the server had closed (cap)
    pacer: Pacer = field(default_factory=Pacer)

    def mismatch(self, target: str, what: str) -> None:
        self.n_mismatches += 1
        if len(self.mismatches) < 50:
            self.mismatches.append(f"{target}: {what}")

    @property
    def messages(self) -> int:
        return sum(self.sent.values())

    def summary(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "sent": dict(self.sent),
            "bad": dict(self.bad),
            "answered": dict(self.answered),
            "bad_unprocessed": dict(self.unprocessed),
            "mismatches": self.n_mismatches,
            "first_mismatches": self.mismatches[:10],
        }


def log_faults(log: str) -> list[str]:
    """The lines of a server log that show an unhandled exception or an error."""
    return [line for line in log.splitlines() if any(mark in line for mark in LOG_FAULTS)]


@dataclass
class TurnTimes:
    server_ms: list[float] = field(default_factory=list)  # turn.metrics voice_to_voice (typed: from arrival)
    client_ms: list[float] = field(default_factory=list)  # input.text sent -> first audio frame received
    failed: int = 0


@dataclass
class Plan:
    """How many messages go where in one round (`messages` in all, roughly)."""

    messages: int
    seed: int = 0
    limit: int = 65536  # the gateway's VOICEAGENT_MAX_MESSAGE_BYTES
    ws_per_connection: int = 100
    twilio_per_call: int = 12
    parallel: int = 4
    loris: int = 24
    rate: float | None = None  # messages a second, all targets together (None: as fast as they go)

    @property
    def shares(self) -> dict[str, int]:
        return {
            "ws": int(self.messages * 0.6),
            "twilio": int(self.messages * 0.25),
            "webrtc": int(self.messages * 0.05),
            "engine": int(self.messages * 0.10),
        }


Progress = Callable[[Tally], None]
