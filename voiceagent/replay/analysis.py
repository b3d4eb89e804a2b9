"""Per-turn latency stages and run statistics from a trace (see voiceagent/trace.py and docs/design.md).

Every voice stage is measured in milliseconds from the turn's `vad.speech_end` time (`t_ns`: the end of the
last voiced frame), to the first record of its event:

- `endpointing`: how long the endpointer waited before it was sure (`speech_end.confirmed_ns - t_ns`);
- `asr_final`: the final transcript (`asr.final`);
- `first_block`: the first committed block of the reply (`llm.first_block`);
- `tts_first_audio`: the first synthesized audio (`tts.first_audio`);
- `voice_to_voice`: the first reply audio handed to the transport (`out.first_audio`).

A typed turn (`asr.final` with `typed: true`, no speech) has no voice stages: its stage values are all None,
so it never counts in the run's statistics; its waterfall is drawn from the `asr.final` time instead.

Records are not in time order in the file, so nothing here relies on file order. Timestamps that cannot be
right are reported in `problems` and never counted: a stage that would end before the speech ended (a
negative value), and any record older than its session's `session.start`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from voiceagent.replay.stats import Speculative, Stats, percentiles, rounded, speculative_words
from voiceagent.replay.traces import TraceFile, drop_before_session_start, is_known_event
from voiceagent.trace import (
    ASR_FINAL,
    CHUNK_PHRASE,
    LATENCY_EVENTS,
    LLM_BLOCK,
    LLM_FIRST_BLOCK,
    OUT_PLAYED,
    SESSION_END,
    SESSION_START,
    TURN_END,
    TURN_ERROR,
    TURN_INTERRUPTED,
    VAD_SPEECH_END,
    VAD_SPEECH_START,
)

# The stages in pipeline order, each measured from the end of the user's speech.
STAGES = ("endpointing", "asr_final", "first_block", "tts_first_audio", "voice_to_voice")
STAGE_EVENTS = LATENCY_EVENTS  # the stages timed by the first record of an event (the session's own figures)
STAGE_TITLES = {
    "endpointing": "endpointing",
    "asr_final": "ASR final",
    "first_block": "LLM first block",
    "tts_first_audio": "TTS first audio",
    "voice_to_voice": "voice-to-voice",
}
OUTCOMES = ("done", "interrupted", "error", "incomplete")
# Events a turn is made of: a (session, turn) pair without any of these is not a user turn.
TURN_OPENERS = frozenset({VAD_SPEECH_START, VAD_SPEECH_END, ASR_FINAL})
SESSION_EVENTS = frozenset({SESSION_START, SESSION_END})


class Span(NamedTuple):
    """A bar of the waterfall: `label` from `start_ms` to `end_ms`, relative to the turn's origin."""

    label: str
    start_ms: float
    end_ms: float


class Marker(NamedTuple):
    """A point of the waterfall (a committed block): `label` at `t_ms`, with the record's figures."""

    label: str
    t_ms: float
    args: dict[str, Any]


@dataclass
class TurnTiming:
    """One user turn of one session: its stages (ms from the end of speech, None when missing or not
    counted), what was said, how it ended (one of OUTCOMES), and the waterfall's spans and markers.

    `origin_ns` is the absolute time the spans are relative to: the `vad.speech_end` time, or the
    `asr.final` time of a typed turn; None when the turn has neither (no spans then)."""

    session: str
    turn: int
    stages: dict[str, float | None]
    transcript: str = ""
    reply: str = ""
    outcome: str = "incomplete"
    typed: bool = False
    error: str | None = None
    origin_ns: int | None = None
    speculative: Speculative = field(default_factory=Speculative)
    spans: list[Span] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)

    @property
    def voice_to_voice(self) -> float | None:
        return self.stages.get("voice_to_voice")

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "turn": self.turn,
            "typed": self.typed,
            "outcome": self.outcome,
            "error": self.error,
            "transcript": self.transcript,
            "reply": self.reply,
            "stages": {name: rounded(value) for name, value in self.stages.items()},
            "speculative": self.speculative.to_json(),
        }


@dataclass
class RunSummary:
    """A whole trace (one run, possibly several sessions): its turns, each stage's statistics over the
    turns that have it, the run's speculative figures, and every problem met reading or analysing it."""

    label: str
    turns: list[TurnTiming]
    stages: dict[str, Stats]
    speculative: Speculative
    problems: list[str]
    path: str = ""

    @property
    def voice_to_voice(self) -> Stats:
        return self.stages["voice_to_voice"]

    def outcomes(self) -> dict[str, int]:
        """How many turns ended each way."""
        counts = dict.fromkeys(OUTCOMES, 0)
        for turn in self.turns:
            counts[turn.outcome] = counts.get(turn.outcome, 0) + 1
        return counts

    def text_table(self) -> str:
        """The run's statistics as a plain-text table for the terminal."""
        lines = [f"{self.label}: {len(self.turns)} turn(s), " + _outcome_words(self.outcomes())]
        lines.append(f"  {'stage':<18}{'n':>5}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}{'mean ms':>10}")
        for name, stats in self.stages.items():
            cells = "".join(f"{_ms(value):>10}" for value in (stats.p50, stats.p95, stats.max, stats.mean))
            lines.append(f"  {STAGE_TITLES.get(name, name):<18}{stats.n:>5}{cells}")
        lines.append("  " + speculative_words(self.speculative))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for `--json` (ms rounded to the microsecond); voice_to_voice is also at the top."""
        return {
            "label": self.label,
            "path": self.path,
            "turns": len(self.turns),
            "outcomes": self.outcomes(),
            "voice_to_voice": self.voice_to_voice.to_json(),
            "stages": {name: stats.to_json() for name, stats in self.stages.items()},
            "speculative": self.speculative.to_json(),
            "problems": list(self.problems),
            "per_turn": [turn.to_json() for turn in self.turns],
        }


def summarize(trace: TraceFile, label: str) -> RunSummary:
    """The run's turns and statistics; the trace's reading problems come first in `problems`."""
    problems = list(trace.problems)
    turns = analyse_records(trace.records, problems)
    stages = {name: percentiles(_present(turn.stages[name] for turn in turns)) for name in STAGES}
    speculative = Speculative()
    for turn in turns:
        speculative = speculative.add(turn.speculative)
    return RunSummary(label, turns, stages, speculative, problems, path=str(trace.path))


def analyse_records(records: Sequence[dict[str, Any]], problems: list[str]) -> list[TurnTiming]:
    """The user turns in `records` (any order, any number of sessions), sorted by session (first record
    first) then turn number. Appends what it had to leave out to `problems`."""
    usable = [record for record in records if is_known_event(record["event"])]
    usable = drop_before_session_start(usable, problems)
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    session_first: dict[str, int] = {}
    for record in usable:
        session = record["session"]
        session_first[session] = min(session_first.get(session, record["t_ns"]), record["t_ns"])
        if record["event"] not in SESSION_EVENTS:
            groups[(session, record["turn"])].append(record)
    keys = [key for key, group in groups.items() if any(r["event"] in TURN_OPENERS for r in group)]
    keys.sort(key=lambda key: (session_first[key[0]], key[0], key[1]))
    return [analyse_turn(session, turn, groups[(session, turn)], problems) for session, turn in keys]


class _Turn:
    """The records of one turn, by event, each event's list in time order."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.by_event: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in sorted(records, key=lambda r: r["t_ns"]):
            self.by_event[record["event"]].append(record)

    def first(self, event: str) -> dict[str, Any] | None:
        found = self.by_event.get(event)
        return found[0] if found else None

    def all(self, event: str) -> list[dict[str, Any]]:
        return self.by_event.get(event, [])


def analyse_turn(session: str, number: int, records: list[dict[str, Any]], problems: list[str]) -> TurnTiming:
    """One turn's stages, outcome, speculative figures and waterfall (see the module's docstring)."""
    turn = _Turn(records)
    timing = TurnTiming(session, number, dict.fromkeys(STAGES))
    final, end = turn.first(ASR_FINAL), turn.first(VAD_SPEECH_END)
    if final is not None:
        timing.transcript = _text(final.get("text"))
        timing.typed = final.get("typed") is True
    timing.outcome, timing.error = _outcome(turn)
    blocks = turn.all(LLM_BLOCK)
    timing.reply = _reply(turn, blocks)
    timing.speculative = _speculative(turn, blocks)
    origin = final if timing.typed and end is None else end  # a typed turn is drawn from its message
    if origin is None:
        return timing
    timing.origin_ns = origin["t_ns"]
    clock = _TurnClock(origin["t_ns"], f"session {session or '(none)'} turn {number}", problems)
    confirmed_ms = None if end is None else clock.endpointing(end)
    points = {name: clock.ms(turn.first(event), STAGE_TITLES[name]) for name, event in STAGE_EVENTS.items()}
    if not timing.typed:
        timing.stages["endpointing"] = confirmed_ms
        timing.stages.update(points)
    block_ms = [(record, clock.ms(record, "an llm.block")) for record in blocks]
    played = [clock.ms(record, "out.played") for record in turn.all(OUT_PLAYED)]
    timing.spans = _spans(
        turn, clock, confirmed_ms, points, _present(ms for _, ms in block_ms), _present(played)
    )
    timing.markers = [
        Marker(f"block {index}", ms, _block_args(record))
        for index, (record, ms) in enumerate(block_ms, start=1)
        if ms is not None
    ]
    return timing


class _TurnClock:
    """Times of one turn's records in ms from its origin; what cannot be right goes to `problems`."""

    def __init__(self, origin_ns: int, where: str, problems: list[str]) -> None:
        self.origin_ns, self.where, self.problems = origin_ns, where, problems

    def ms(self, record: dict[str, Any] | None, name: str) -> float | None:
        """ms from the origin to `record`; None (and a problem) when it would be before the origin."""
        if record is None:
            return None
        ms = (record["t_ns"] - self.origin_ns) / 1e6
        if ms < 0:
            self.problem(
                f"{name} is {-ms:.1f} ms before the end of speech (out-of-order timestamps): not counted"
            )
            return None
        return ms

    def endpointing(self, end: dict[str, Any]) -> float | None:
        """How long the endpointer waited after the last voiced frame (`confirmed_ns - t_ns`)."""
        confirmed = end.get("confirmed_ns")
        if not _is_int(confirmed):
            self.problem("vad.speech_end has no integer confirmed_ns: no endpointing time")
            return None
        waited_ms = (confirmed - end["t_ns"]) / 1e6
        if waited_ms < 0:
            self.problem(
                f"vad.speech_end confirmed {-waited_ms:.1f} ms before the speech ended (out-of-order "
                "timestamps): not counted"
            )
            return None
        return waited_ms

    def problem(self, text: str) -> None:
        self.problems.append(f"{self.where}: {text}")


def _spans(
    turn: _Turn,
    clock: _TurnClock,
    confirmed_ms: float | None,
    points: dict[str, float | None],
    block_ms: list[float],
    played_ms: list[float],
) -> list[Span]:
    """The waterfall's bars; a bar whose end comes before its start is reported and left out."""
    spans: list[Span] = []

    def add(label: str, start: float | None, end: float | None) -> None:
        if start is None or end is None:
            return
        if end < start:
            clock.problem(
                f"{label} ends {start - end:.1f} ms before it starts (out-of-order timestamps): not drawn"
            )
            return
        spans.append(Span(label, start, end))

    speech_start, spoken = turn.first(VAD_SPEECH_START), turn.first(VAD_SPEECH_END) is not None
    if speech_start is not None and spoken:
        add("user speech", (speech_start["t_ns"] - clock.origin_ns) / 1e6, 0.0)
    add("endpointing", 0.0, confirmed_ms)
    asr_final, first_block = points["asr_final"], points["first_block"]
    if spoken:
        add("ASR final", confirmed_ms if confirmed_ms is not None else 0.0, asr_final)
    add("LLM first block", asr_final, first_block)
    if block_ms and first_block is not None and max(block_ms) > first_block:
        add("LLM decoding", first_block, max(block_ms))
    phrase = clock.ms(turn.first(CHUNK_PHRASE), "the first chunk.phrase")
    if phrase is not None and first_block is not None and phrase >= first_block:
        add("first phrase", first_block, phrase)  # the chunker waiting for enough committed words
        add("TTS", phrase, points["tts_first_audio"])
    else:  # traces from before chunk.phrase was written
        add("TTS", first_block, points["tts_first_audio"])
    if played_ms:
        add("audio out", points["voice_to_voice"], max(played_ms))
    return spans


def _outcome(turn: _Turn) -> tuple[str, str | None]:
    """done / interrupted / error / incomplete (an error wins, then a barge-in, then the turn's end)."""
    error = turn.first(TURN_ERROR)
    if error is not None:
        return "error", f"{_text(error.get('stage'))}: {_text(error.get('message'))}"
    if turn.first(TURN_INTERRUPTED) is not None:
        return "interrupted", None
    if turn.first(TURN_END) is not None:
        return "done", None
    return "incomplete", None


def _reply(turn: _Turn, blocks: list[dict[str, Any]]) -> str:
    """The reply as the turn ended it, or the blocks committed so far."""
    end = turn.first(TURN_END)
    if end is not None and isinstance(end.get("reply"), str):
        return str(end["reply"])
    return "".join(_text(block.get("text")) for block in blocks).strip()


def _speculative(turn: _Turn, blocks: list[dict[str, Any]]) -> Speculative:
    """The turn's block counts; the decoding time needs every block's token count."""
    figures = Speculative(blocks=len(blocks))
    counts = [_count(block.get("n_tokens")) for block in blocks]
    for block, tokens in zip(blocks, counts, strict=True):
        if tokens is not None:
            figures.blocks_with_tokens += 1
            figures.tokens += tokens
        figures.drafted += _count(block.get("n_drafted")) or 0
        figures.accepted += _count(block.get("n_accepted")) or 0
    first_tokens = counts[0] if counts else None
    if len(blocks) >= 2 and first_tokens is not None and None not in counts:
        after_first = figures.tokens - first_tokens
        span_ms = (blocks[-1]["t_ns"] - blocks[0]["t_ns"]) / 1e6
        if after_first > 0 and span_ms >= 0:
            figures.decode_tokens, figures.decode_ms = after_first, span_ms
    first = turn.first(LLM_FIRST_BLOCK)
    figures.preemptive_turns = int(first is not None and first.get("preemptive") is True)
    return figures


def _block_args(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "text": _text(record.get("text")),
        "n_tokens": _count(record.get("n_tokens")),
        "n_drafted": _count(record.get("n_drafted")),
        "n_accepted": _count(record.get("n_accepted")),
    }


def _outcome_words(counts: dict[str, int]) -> str:
    return ", ".join(f"{count} {name}" for name, count in counts.items() if count) or "none"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _present(values: Iterable[float | None]) -> list[float]:
    return [value for value in values if value is not None]


def _count(value: Any) -> int | None:
    """A token count from a record: a non-negative integer, else None."""
    return value if _is_int(value) and value >= 0 else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)
