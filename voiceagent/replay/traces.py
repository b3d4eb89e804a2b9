"""Reading a latency trace file (JSONL, see voiceagent/trace.py) without trusting its content.

A trace is written one flushed line per event, so a crash can leave a truncated last line, and a file may be
edited, concatenated or corrupted. `read_trace` keeps every well-formed record (in file order, which is not
time order: VAD edges carry the earlier time of their frame) and describes every line it could not use as a
readable problem with its line number. Bad content never raises; only a missing or unreadable file does.
`drop_before_session_start` leaves out the records whose timestamps cannot be right.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voiceagent.trace import (
    PIPELINE_EVENTS,
    REC_AUDIO,
    SESSION_START,
    TRANSPORT_EVENT_PREFIXES,
    VAD_SPEECH_END,
    VAD_SPEECH_START,
)

# Records dated by the start of their audio, not by when they were written: the gateway dates a frame from
# its message's arrival minus the message's audio length (gateway/inbound.py), so the first frames may come
# before session.start by up to one client message (a Twilio frame: 20 ms; a WebSocket chunk: more).
AUDIO_DATED = frozenset({VAD_SPEECH_START, VAD_SPEECH_END, REC_AUDIO})
AUDIO_DATED_SLACK_NS = 1_000_000_000


@dataclass
class TraceFile:
    """One trace file as read: its well-formed records (file order) and what was wrong with the rest."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def is_known_event(event: str) -> bool:
    """True for the events the analysis understands, and for transport events (voiceagent/trace.py names
    both); the others are kept but ignored."""
    return event in PIPELINE_EVENTS or event.startswith(TRANSPORT_EVENT_PREFIXES)


def read_trace(path: Path | str) -> TraceFile:
    """Reads a JSONL trace. Raises FileNotFoundError (with a plain message) when there is no such file;
    everything wrong inside the file goes to `problems` instead."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no trace file at {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a trace file")
    text = path.read_bytes().decode("utf-8", errors="replace")
    trace = TraceFile(path)
    if not text.strip():
        trace.problems.append(f"{path.name}: the file is empty (no records)")
        return trace
    lines = text.split("\n")
    ends_with_newline = text.endswith("\n")
    if ends_with_newline:
        lines.pop()  # the empty string after the final newline
    unknown: Counter[str] = Counter()
    first_unknown: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last_unfinished = number == len(lines) and not ends_with_newline
        record, problem = parse_line(line)
        if problem is not None:
            if last_unfinished:
                problem = "the last line is cut short (the writer stopped mid-line?)"
            trace.problems.append(f"line {number}: {problem}; skipped")
            continue
        assert record is not None
        if not is_known_event(record["event"]):
            unknown[record["event"]] += 1
            first_unknown.setdefault(record["event"], number)
        trace.records.append(record)
    for event, count in unknown.items():
        plural = "record" if count == 1 else "records"
        trace.problems.append(
            f"line {first_unknown[event]}: unknown event {event!r} ({count} {plural}): kept, not analysed"
        )
    return trace


def parse_line(line: str) -> tuple[dict[str, Any] | None, str | None]:
    """One line as a record, or None and what is wrong with it. A record needs an integer `t_ns`, an
    integer `turn` and a string `event`; `session` must be a string when present ("" when absent)."""
    try:
        record = json.loads(line)
    except ValueError as error:
        return None, f"not JSON ({error.__class__.__name__}: {_short(str(error))})"
    if not isinstance(record, dict):
        return None, f"not a JSON object but {type(record).__name__}"
    for key, kind in (("t_ns", "an integer"), ("turn", "an integer"), ("event", "a string")):
        if key not in record:
            return None, f"no {key!r}"
        value = record[key]
        ok = isinstance(value, str) if key == "event" else _is_int(value)
        if not ok:
            return None, f"{key!r} is not {kind} ({_short(repr(value))})"
    if not record["event"]:
        return None, "'event' is empty"
    session = record.setdefault("session", "")
    if not isinstance(session, str):
        return None, f"'session' is not a string ({_short(repr(session))})"
    return record, None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def drop_before_session_start(records: list[dict[str, Any]], problems: list[str]) -> list[dict[str, Any]]:
    """Records older than their session's `session.start` (clock trouble, or a mixed-up file) are left out;
    audio-dated records only when they are older by more than AUDIO_DATED_SLACK_NS."""
    starts: dict[str, int] = {}
    for record in records:
        if record["event"] == SESSION_START:
            session = record["session"]
            starts[session] = min(starts.get(session, record["t_ns"]), record["t_ns"])
    kept: list[dict[str, Any]] = []
    early: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        start = starts.get(record["session"])
        slack = AUDIO_DATED_SLACK_NS if record["event"] in AUDIO_DATED else 0
        if start is not None and record["t_ns"] < start - slack:
            early[record["session"]].append(record)
        else:
            kept.append(record)
    for session, dropped in early.items():
        first = min(dropped, key=lambda r: r["t_ns"])
        problems.append(
            f"session {session or '(none)'}: {len(dropped)} record(s) dated before its session.start "
            f"(out-of-order timestamps, e.g. turn {first['turn']} {first['event']} "
            f"{(starts[session] - first['t_ns']) / 1e6:.1f} ms early): not counted"
        )
    return kept
