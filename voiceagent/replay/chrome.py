"""Runs as a Chrome trace-event file (`{"traceEvents": [...]}`), which Perfetto and chrome://tracing open.

One process per (run, session), named after both; one thread (lane) per kind of waterfall bar, plus a lane
for the whole turns and one for the committed blocks. Bars are complete events (`"ph": "X"`, `ts` and `dur`
in microseconds), blocks and the first reply audio are instant events (`"ph": "i"`). Each run's clock
starts at 0 at its first drawn moment, so two runs line up when opened together.
"""

from __future__ import annotations

from typing import Any

from voiceagent.replay.analysis import STAGE_TITLES, RunSummary, TurnTiming

TURN_LANE = "turns"
BLOCK_LANE = "LLM blocks"
SPAN_LANES = (
    "user speech",
    "endpointing",
    "ASR final",
    "LLM first block",
    "LLM decoding",
    "first phrase",
    "TTS",
    "audio out",
)
LANES = (TURN_LANE, *SPAN_LANES, BLOCK_LANE)


def chrome_trace(runs: list[RunSummary]) -> dict[str, Any]:
    """The runs' turns as trace events (see the module's docstring); json.dumps-able as it is."""
    events: list[dict[str, Any]] = []
    pid = 0
    for index, run in enumerate(runs):
        drawn = [turn for turn in run.turns if turn.origin_ns is not None]
        t0 = min((_turn_start_ns(turn) for turn in drawn), default=0)
        sessions: dict[str, int] = {}
        for turn in drawn:
            if turn.session not in sessions:
                pid += 1
                sessions[turn.session] = pid
                events.extend(_process_metadata(pid, f"{run.label} | session {turn.session}", pid))
                events.extend(_lane_metadata(pid))
            events.extend(turn_events(turn, sessions[turn.session], t0, run_index=index))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def turn_events(turn: TurnTiming, pid: int, t0_ns: int, run_index: int = 0) -> list[dict[str, Any]]:
    """One turn's bars and points; times in µs from `t0_ns`."""
    assert turn.origin_ns is not None
    origin_us = (turn.origin_ns - t0_ns) / 1000

    def us(ms: float) -> float:
        return round(origin_us + ms * 1000, 3)

    events: list[dict[str, Any]] = []
    if turn.spans or turn.markers:
        points = [s.start_ms for s in turn.spans] + [s.end_ms for s in turn.spans]
        points += [m.t_ms for m in turn.markers]
        start, end = min(points), max(points)
        args = {
            "run": run_index,
            "outcome": turn.outcome,
            "typed": turn.typed,
            "transcript": turn.transcript,
            "reply": turn.reply,
            **{f"{STAGE_TITLES[name]} (ms)": value for name, value in turn.stages.items()},
        }
        events.append(_complete(f"turn {turn.turn}", "turn", us(start), (end - start) * 1000, pid, args))
    for span in turn.spans:
        args = {"turn": turn.turn, "from_ms": span.start_ms, "to_ms": span.end_ms}
        dur = (span.end_ms - span.start_ms) * 1000
        events.append(_complete(span.label, "stage", us(span.start_ms), dur, pid, args, lane=span.label))
    for marker in turn.markers:
        args = {"turn": turn.turn, "at_ms": marker.t_ms, **marker.args}
        events.append(_instant(marker.label, "llm", us(marker.t_ms), pid, BLOCK_LANE, args))
    v2v = turn.stages.get("voice_to_voice")
    if v2v is not None:
        args = {"turn": turn.turn, "voice_to_voice_ms": v2v}
        events.append(_instant("voice-to-voice", "out", us(v2v), pid, TURN_LANE, args))
    return events


def _turn_start_ns(turn: TurnTiming) -> int:
    assert turn.origin_ns is not None
    starts = [s.start_ms for s in turn.spans] + [m.t_ms for m in turn.markers] + [0.0]
    return turn.origin_ns + round(min(starts) * 1e6)


def _tid(lane: str) -> int:
    return LANES.index(lane) + 1 if lane in LANES else len(LANES) + 1


def _complete(
    name: str, cat: str, ts: float, dur: float, pid: int, args: dict[str, Any], lane: str = TURN_LANE
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": ts,
        "dur": round(max(dur, 0.0), 3),
        "pid": pid,
        "tid": _tid(lane),
        "args": args,
    }


def _instant(name: str, cat: str, ts: float, pid: int, lane: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "i",
        "s": "t",
        "ts": ts,
        "pid": pid,
        "tid": _tid(lane),
        "args": args,
    }


def _process_metadata(pid: int, name: str, order: int) -> list[dict[str, Any]]:
    return [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": name}},
        {
            "name": "process_sort_index",
            "ph": "M",
            "ts": 0,
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": order},
        },
    ]


def _lane_metadata(pid: int) -> list[dict[str, Any]]:
    events = []
    for lane in LANES:
        tid = _tid(lane)
        events.append(
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {"name": lane}}
        )
        events.append(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "ts": 0,
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": tid},
            }
        )
    return events
