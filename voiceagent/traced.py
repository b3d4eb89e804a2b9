"""A voice session with its trace, opened and closed in one place (the gateway's hub and `talk` both use it).

    async with traced_session(pipeline, "talk", clock, options, trace_path=path) as traced:
        await traced.session.push_audio(frame)
        ...
        traced.times.latencies_ms(turn)   # fed as the trace is written, never re-read

Opening makes the trace (with a `TurnTimes` observer), the session on the pipeline, and writes
session.start. Closing closes the session and its LLM conversation, then writes session.end and closes the
trace, however the block was left. A session that cannot be made leaves no trace file open.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from voiceagent.clock import Clock
from voiceagent.session import Session, SessionOptions
from voiceagent.trace import SESSION_END, SESSION_START, Trace, TurnTimes


class PipelineLike(Protocol):
    """What opening a session needs of `voiceagent.pipeline.Pipeline` (tests pass a fake one)."""

    def new_session(self, clock: Clock, trace: Trace, options: SessionOptions | None = None) -> Session: ...


@dataclass
class TracedSession:
    session: Session
    trace: Trace
    times: TurnTimes  # the headline times of each turn, from the trace as it is written

    @property
    def id(self) -> str:
        return self.trace.session_id


def new_session_id() -> str:
    return uuid.uuid4().hex[:12]


@contextlib.asynccontextmanager
async def traced_session(
    pipeline: PipelineLike,
    transport: str,
    clock: Clock,
    options: SessionOptions | None = None,
    *,
    trace_path: Path | None = None,
    session_id: str | None = None,
    record_audio: bool = False,
) -> AsyncIterator[TracedSession]:
    """A new session on `pipeline`, traced to `trace_path` (in memory only when None) as `transport`
    (see the module docstring). `record_audio` keeps the input audio beside the trace."""
    times = TurnTimes()
    trace = Trace(
        trace_path,
        session_id or new_session_id(),
        clock,
        record_audio=record_audio,
        observers=[times.observe],
    )
    try:
        session = pipeline.new_session(clock, trace, options)
    except BaseException:
        trace.close()
        raise
    trace.write(SESSION_START, 0, transport=transport, output_rate=session.options.output_rate)
    try:
        yield TracedSession(session, trace, times)
    finally:
        try:
            await session.close()
            await session.llm.aclose()
        finally:
            trace.write(SESSION_END, session.turn)
            trace.close()
