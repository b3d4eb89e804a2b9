"""The typed events that flow out of a voice session, in one module, grouped by what a barge-in does to them.

Every event is a frozen dataclass with `t_ns` (from the injected clock) and `turn_id`.

- `UninterruptibleEvent`s are never dropped: what the user did (VAD edges, transcripts) and how a turn
  was cut short (`Interrupted`, `TurnError`), which a client must hear even about an interrupted turn.
- `InterruptibleEvent`s are the agent's reply (committed blocks, synthesised audio, the end of the reply):
  they belong to one turn and are discarded once that turn is interrupted (see docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Event:
    t_ns: int
    turn_id: int


@dataclass(frozen=True)
class UninterruptibleEvent(Event):
    """Never dropped."""


@dataclass(frozen=True)
class InterruptibleEvent(Event):
    """Dropped when its turn is interrupted."""


# ----- never dropped ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeechStarted(UninterruptibleEvent):
    """The user started speaking: `t_ns` is the first voiced frame."""


@dataclass(frozen=True)
class SpeechEnded(UninterruptibleEvent):
    """The user stopped: `t_ns` is the end of the last voiced frame, not when silence confirmed it."""

    confirmed_ns: int = 0  # when the endpointer's silence wait ran out


@dataclass(frozen=True)
class TranscriptPartial(UninterruptibleEvent):
    """What the recogniser has heard so far: `stable` text two passes agreed on, then the rest."""

    stable: str
    text: str


@dataclass(frozen=True)
class TranscriptFinal(UninterruptibleEvent):
    text: str


@dataclass(frozen=True)
class Interrupted(UninterruptibleEvent):
    """The user spoke over the reply: its audio is dropped and the history keeps only `spoken_text`."""

    spoken_text: str


@dataclass(frozen=True)
class ReplyPaused(UninterruptibleEvent):
    """The user started to speak over the reply: stop playing it (keep what is queued) until it resumes or
    is interrupted (voiceagent/barge_in.py)."""


@dataclass(frozen=True)
class ReplyResumed(UninterruptibleEvent):
    """The speech over the reply carried no real words (a backchannel, a cough): play on where it paused."""


@dataclass(frozen=True)
class TurnError(UninterruptibleEvent):
    """A stage failed, or the turn ran over VOICEAGENT_MAX_TURN_S (`code` "turn_too_long"): the turn ends,
    the session keeps listening."""

    stage: str
    message: str
    code: str = "turn_failed"


# ----- dropped on barge-in ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplyText(InterruptibleEvent):
    """One committed block of the reply from the LLM."""

    text: str
    n_drafted: int | None = None
    n_accepted: int | None = None
    first: bool = False


@dataclass(frozen=True, eq=False)
class SpeechAudio(InterruptibleEvent):
    """Synthesised reply audio: PCM16 mono at `sample_rate`, with the phrase it speaks."""

    samples: np.ndarray = field(repr=False)
    sample_rate: int = 16000
    phrase: str = ""


@dataclass(frozen=True)
class TurnEnded(InterruptibleEvent):
    """The reply is over: `reason` is "done", "interrupted" (barge-in) or "error"."""

    reason: str
    spoken_text: str = ""
