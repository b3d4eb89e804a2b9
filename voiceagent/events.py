"""The typed events that flow through a voice session, in one module.

Every event is a frozen dataclass with `t_ns` (from the injected clock) and `turn_id`. `InputEvent`s (audio
in, VAD edges, transcripts, control) are never dropped. `OutputEvent`s (LLM blocks, phrases, TTS audio)
belong to one turn and are discarded when that turn is interrupted. `trace_name` is the event's name in
the session trace (`stage.event`, see DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np


@dataclass(frozen=True)
class Event:
    t_ns: int
    turn_id: int
    trace_name: ClassVar[str] = ""


@dataclass(frozen=True)
class InputEvent(Event):
    """Never dropped."""


@dataclass(frozen=True)
class OutputEvent(Event):
    """Dropped when its turn is interrupted."""


@dataclass(frozen=True, eq=False)
class AudioFrame(InputEvent):
    """20 ms of the user's audio: PCM16 mono 16 kHz, [320] int16."""

    samples: np.ndarray = field(repr=False)
    trace_name: ClassVar[str] = "in.audio"


@dataclass(frozen=True)
class SpeechStarted(InputEvent):
    trace_name: ClassVar[str] = "vad.speech_start"


@dataclass(frozen=True)
class SpeechEnded(InputEvent):
    """The user stopped: `t_ns` is the end of the last voiced frame, not when silence confirmed it."""

    confirmed_ns: int = 0  # when the endpointer's silence wait ran out
    trace_name: ClassVar[str] = "vad.speech_end"


@dataclass(frozen=True)
class TranscriptPartial(InputEvent):
    """What the recogniser has heard so far: `stable` text two passes agreed on, then the rest."""

    stable: str
    text: str
    trace_name: ClassVar[str] = "asr.partial"


@dataclass(frozen=True)
class TranscriptFinal(InputEvent):
    text: str
    trace_name: ClassVar[str] = "asr.final"


@dataclass(frozen=True)
class ReplyText(OutputEvent):
    """One committed block of the reply from the LLM."""

    text: str
    n_drafted: int | None = None
    n_accepted: int | None = None
    first: bool = False
    trace_name: ClassVar[str] = "llm.block"


@dataclass(frozen=True)
class Phrase(OutputEvent):
    """Committed text the chunker hands to TTS."""

    text: str
    trace_name: ClassVar[str] = "chunk.phrase"


@dataclass(frozen=True, eq=False)
class SpeechAudio(OutputEvent):
    """Synthesised reply audio: PCM16 mono at `sample_rate`, with the phrase it speaks."""

    samples: np.ndarray = field(repr=False)
    sample_rate: int = 16000
    phrase: str = ""
    trace_name: ClassVar[str] = "tts.audio"


@dataclass(frozen=True)
class TurnEnded(OutputEvent):
    """The reply is over: `reason` is "done", "interrupted" (barge-in) or "error"."""

    reason: str
    spoken_text: str = ""
    trace_name: ClassVar[str] = "turn.end"


@dataclass(frozen=True)
class Interrupted(InputEvent):
    """The user spoke over the reply: its audio is dropped and the history keeps only `spoken_text`."""

    spoken_text: str
    trace_name: ClassVar[str] = "turn.interrupted"


@dataclass(frozen=True)
class TurnError(InputEvent):
    """A stage failed, or the turn ran over VOICEAGENT_MAX_TURN_S (`code` "turn_too_long"): the turn ends,
    the session keeps listening."""

    stage: str
    message: str
    code: str = "turn_failed"
    trace_name: ClassVar[str] = "turn.error"
