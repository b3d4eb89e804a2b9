"""The roles a voice session wires together, as structural types.

Each role has one real implementation (vad.Endpointer, asr.StreamingRecognizer, chunker.PhraseChunker)
and one fake in tests/fakes.py; the session knows only these shapes. Speech synthesis has two real ones,
so its shape is the `Synthesizer` protocol in voiceagent/tts.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


class VadEdgeLike(Protocol):
    @property
    def kind(self) -> str: ...  # "speech_start" | "speech_end"

    @property
    def t_ns(self) -> int: ...  # start: first voiced frame; end: end of the last voiced frame

    @property
    def confirmed_ns(self) -> int: ...


class EndpointerLike(Protocol):
    def push(self, frame: np.ndarray, t_ns: int) -> Sequence[VadEdgeLike]: ...

    def speaking(self) -> bool: ...

    def silence_ms(self) -> float: ...  # while speaking: how long the user has been silent

    def quiet_ms(self) -> float: ...  # while speaking: how long the audio has been quiet (>= silence_ms)

    def set_guard(self, active: bool) -> None: ...

    def last_voiced_ns(self) -> int: ...  # the end of the last voiced audio

    def last_loud_ns(self) -> int: ...  # the end of the last voiced audio that was also loud

    # the silence that ends speech, from now on (`from_quiet`: counted from the quiet tail's start)
    def set_end_silence_ms(self, ms: int, from_quiet: bool | None = None) -> None: ...


class TranscriptLike(Protocol):
    @property
    def stable(self) -> str: ...

    @property
    def text(self) -> str: ...


def heard_audio(transcript: TranscriptLike) -> np.ndarray | None:
    """The utterance's audio a partial heard, where its recogniser keeps it (asr.py `Transcript.audio`)."""
    audio = getattr(transcript, "audio", None)
    return audio if isinstance(audio, np.ndarray) and audio.size else None


def heard_confidence(transcript: TranscriptLike) -> float | None:
    """The recogniser's least token probability in a partial, where it says (`Transcript.confidence`)."""
    confidence = getattr(transcript, "confidence", None)
    return float(confidence) if isinstance(confidence, float | int) else None


class TurnAudioModel(Protocol):
    """P(the turn is complete) from how the turn's audio so far sounds (voiceagent/smart_turn.py)."""

    def probability(self, audio: np.ndarray) -> float: ...  # [n] float32 16 kHz


# A recogniser's final reuses its last partial if that heard this much past the end of speech (the end of
# Silero's last voiced chunk): the late pause partial (128 ms) does, the first (32 ms) does not, unless the
# session says a reply runs on it (voiceagent/partials.py `final_trailing_ms`). Moonshine reads an utterance
# better with the silence after it; a run at 0.03 misread 2 words more on 16 `voiceagent bench` clips
# (WER 0.070 against 0.042), within the run-to-run spread of misreads, but 0.1 is the safer side.
FINAL_MARGIN_S = 0.1


class RecognizerLike(Protocol):
    """Synchronous and CPU-heavy: the session calls decode_* in worker threads. `push` takes every frame;
    before `start` it keeps them as pre-roll. `decode_final` is told how much audio after the end of
    speech it holds, so it can reuse a partial that already heard everything (`FINAL_MARGIN_S` past it)."""

    def start(self) -> None: ...

    def push(self, frame: np.ndarray) -> None: ...

    def decode_partial(self) -> TranscriptLike: ...

    def decode_final(self, trailing_silence_ms: float = 0.0) -> str: ...


class PartialStopped(Exception):
    """A partial's decode was stopped before it finished (`StoppableRecognizer.stop_partial`)."""


@runtime_checkable
class StoppableRecognizer(Protocol):
    """A recogniser whose partial in progress can be ended early: the session stops a partial that can
    no longer be of use (voiceagent/session.py) so the pause partial starts sooner."""

    def stop_partial(self) -> None: ...  # the decode_partial in progress raises PartialStopped soon


class ChunkerLike(Protocol):
    def push(self, text: str) -> list[str]: ...

    def flush(self) -> list[str]: ...


@runtime_checkable
class BargeInRecognizer(Protocol):
    """A recogniser that hears speech begun over the agent's reply with a recogniser of its own
    (voiceagent/recognizers.py `SplitRecognizer`)."""

    def start_barge_in(self) -> None: ...  # as `start`, for an utterance begun over the agent's reply


def start_utterance(recognizer: RecognizerLike, over_reply: bool) -> None:
    """Starts the recogniser's utterance; one begun over the agent's reply (a possible barge-in) with the
    recogniser's own for such speech, where it has one."""
    if over_reply and isinstance(recognizer, BargeInRecognizer):
        recognizer.start_barge_in()
    else:
        recognizer.start()
