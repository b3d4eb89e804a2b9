"""The per-session latency trace: one JSON object per line, appended and flushed per event.

A record is `{"t_ns", "session", "turn", "stage", "event", ...data}` (see docs/design.md). Flushing every
line means a crash loses nothing already written. Voice-to-voice latency = out.first_audio - vad.speech_end.

This module owns the trace's vocabulary: every event name is a constant here, used by every writer (the
session, the gateway, `talk`, the recorder, the replay drivers) and by the replay analysis. `TurnTimes`
watches the records as they are written, so a session's per-turn figures never re-read the trace.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from voiceagent.clock import Clock
from voiceagent.recording import AudioRecorder

# A session's bounds (gateway/hub.py, talk.py, the replay drivers).
SESSION_START = "session.start"
SESSION_END = "session.end"
REC_AUDIO = "rec.audio"  # one recorded input WAV (recording.py)
# Turn-taking and transcripts (session.py).
VAD_SPEECH_START = "vad.speech_start"
VAD_SPEECH_END = "vad.speech_end"
ASR_PARTIAL = "asr.partial"
ASR_PARTIAL_ERROR = "asr.partial_error"
ASR_PARTIAL_STOPPED = "asr.partial_stopped"  # a partial stopped for the pause partial (partials.py)
ASR_FINAL = "asr.final"
TURN_SCORE = "turn.score"  # a partial's end-of-turn score, its cost and the wait it set (endpointing.py)
# The reply (session.py, reply.py).
LLM_PREFILL = "llm.prefill"
LLM_PREEMPTIVE_START = "llm.preemptive_start"
LLM_PREEMPTIVE_CANCEL = "llm.preemptive_cancel"
LLM_PROPOSAL_KEPT = "llm.proposal_kept"  # a cancelled preemptive reply's ids, verified again: how many held
LLM_FIRST_BLOCK = "llm.first_block"
LLM_BLOCK = "llm.block"
CHUNK_PHRASE = "chunk.phrase"
TTS_FIRST_AUDIO = "tts.first_audio"
OUT_FIRST_AUDIO = "out.first_audio"
OUT_PLAYED = "out.played"
TURN_END = "turn.end"
TURN_INTERRUPTED = "turn.interrupted"
TURN_PAUSED = "turn.paused"  # speech over the reply: it is held (voiceagent/barge_in.py)
TURN_RESUMED = "turn.resumed"  # ... and goes on: the speech carried no real words
TURN_ERROR = "turn.error"
# Transport events (gateway/twilio.py): known to the analysis, not part of it.
TWILIO_START = "twilio.start"
IN_DTMF = "in.dtmf"
IN_UNKNOWN = "in.unknown"

# The events the replay analysis understands, and the transport families it keeps without analysing.
PIPELINE_EVENTS = frozenset(
    {
        SESSION_START,
        SESSION_END,
        REC_AUDIO,
        VAD_SPEECH_START,
        VAD_SPEECH_END,
        ASR_PARTIAL,
        ASR_PARTIAL_ERROR,
        ASR_PARTIAL_STOPPED,
        ASR_FINAL,
        TURN_SCORE,
        LLM_PREFILL,
        LLM_PREEMPTIVE_START,
        LLM_PREEMPTIVE_CANCEL,
        LLM_PROPOSAL_KEPT,
        LLM_FIRST_BLOCK,
        LLM_BLOCK,
        CHUNK_PHRASE,
        TTS_FIRST_AUDIO,
        OUT_FIRST_AUDIO,
        OUT_PLAYED,
        TURN_END,
        TURN_INTERRUPTED,
        TURN_PAUSED,
        TURN_RESUMED,
        TURN_ERROR,
    }
)
TRANSPORT_EVENT_PREFIXES = ("twilio.", "in.")

# The headline stages, each measured from the end of the user's speech.
LATENCY_EVENTS = {
    "asr_final": ASR_FINAL,
    "first_block": LLM_FIRST_BLOCK,
    "tts_first_audio": TTS_FIRST_AUDIO,
    "voice_to_voice": OUT_FIRST_AUDIO,
}

Record = dict[str, Any]
TraceObserver = Callable[[Record], None]


class Trace:
    """Writes trace records to `path` (if given) and keeps them in memory. Each record is also handed to
    every one of `observers` as it is written (see `TurnTimes`). With `record_audio` (and a path) the
    user's input audio is kept too, in `S.audio/` beside `S.jsonl`."""

    def __init__(
        self,
        path: Path | str | None,
        session_id: str,
        clock: Clock,
        *,
        record_audio: bool = False,
        observers: Sequence[TraceObserver] = (),
    ) -> None:
        self.session_id = session_id
        self.clock = clock
        self.records: list[Record] = []
        self.observers = list(observers)
        self._file: TextIO | None = None
        self._audio: AudioRecorder | None = None
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # closed in close()
            if record_audio:
                self._audio = AudioRecorder(
                    path.with_suffix(".audio"), functools.partial(self.write, REC_AUDIO)
                )

    def record_audio(self, frame: np.ndarray, t_ns: int, turn: int) -> None:
        """Keeps one input frame when recording is on (see voiceagent/recording.py); else does nothing."""
        if self._audio is not None:
            self._audio.push(frame, t_ns, turn)

    def write(self, event: str, turn: int, t_ns: int | None = None, **data: Any) -> Record:
        record = {
            "t_ns": self.clock.now_ns() if t_ns is None else t_ns,
            "session": self.session_id,
            "turn": turn,
            "stage": event.split(".", 1)[0],
            "event": event,
            **data,
        }
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        for observe in self.observers:
            observe(record)
        return record

    def close(self) -> None:
        if self._audio is not None:
            self._audio.close()
            self._audio = None
        if self._file is not None:
            self._file.close()
            self._file = None


class TurnTimes:
    """A trace observer: per turn, when each event was first written, and what the turn's transcript
    records said (typed, with words). Fed one record at a time (`Trace(observers=[times.observe])`)."""

    def __init__(self) -> None:
        self._first_ns: dict[int, dict[str, int]] = {}
        self._typed_ns: dict[int, int] = {}  # the first asr.final of a typed message
        self._with_words: set[int] = set()  # turns with a final transcript that has words
        self._preemptive: set[int] = set()  # turns whose first block came from a preemptive reply

    def observe(self, record: Mapping[str, Any]) -> None:
        turn, event, t_ns = int(record["turn"]), str(record["event"]), int(record["t_ns"])
        self._first_ns.setdefault(turn, {}).setdefault(event, t_ns)
        if event == ASR_FINAL:
            if record.get("typed"):
                self._typed_ns.setdefault(turn, t_ns)
            if record.get("text"):
                self._with_words.add(turn)
        elif event == LLM_FIRST_BLOCK and record.get("preemptive", False):
            self._preemptive.add(turn)

    def latencies_ms(self, turn: int) -> dict[str, float | None]:
        """Milliseconds from the turn's vad.speech_end to the first record of each headline event."""
        first = self._first_ns.get(turn, {})
        return _since(first, first.get(VAD_SPEECH_END))

    def typed(self, turn: int) -> bool:
        """The turn is a typed message (no speech): it has no end of speech to time from."""
        return turn in self._typed_ns and VAD_SPEECH_END not in self._first_ns.get(turn, {})

    def latencies_from_typing_ms(self, turn: int) -> dict[str, float | None]:
        """A typed turn's headline latencies, from the message's arrival (its asr_final is then 0)."""
        return _since(self._first_ns.get(turn, {}), self._typed_ns.get(turn))

    def turns_with_words(self) -> list[int]:
        """The turns whose final transcript had words (in turn order)."""
        return sorted(self._with_words)

    def any_preemptive(self) -> bool:
        """Some turn's first block came from a reply started before the end of speech (and kept)."""
        return bool(self._preemptive)


def _since(first_ns: Mapping[str, int], origin_ns: int | None) -> dict[str, float | None]:
    return {
        name: None if origin_ns is None or event not in first_ns else (first_ns[event] - origin_ns) / 1e6
        for name, event in LATENCY_EVENTS.items()
    }


def turn_latencies_ms(records: Sequence[Mapping[str, Any]], turn: int) -> dict[str, float | None]:
    """Milliseconds from the turn's vad.speech_end to the first record of each headline event."""
    times = TurnTimes()
    for record in records:
        if record.get("turn") == turn:
            times.observe(record)
    return times.latencies_ms(turn)
