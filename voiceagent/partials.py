"""When a session decodes a partial transcript: on a schedule while the user speaks, once when they pause.

While the user speaks, a partial every `partial_every_ms`; once they have been silent `pause_ms`, one more
(the pause partial: it hears the whole utterance, so the reply may start on it and the final reuse it);
then none until they speak again, since a partial started in the silence would not hear the end and would
hold back the pause's. One partial at a time: `PartialSchedule` only says which to start, given that none
is in flight. A partial that returned in the silence having heard every word, and started the reply,
stands in for the pause partial (voiceagent/session.py).
"""

from __future__ import annotations

from typing import Literal

from voiceagent.stages import FINAL_MARGIN_S

__all__ = ["PartialKind", "PartialSchedule", "final_trailing_ms"]

PartialKind = Literal["regular", "pause"]


class PartialSchedule:
    """One session's partial schedule (see the module docstring); times in ns, silences in ms."""

    def __init__(self, partial_every_ms: int, pause_ms: int) -> None:
        self.partial_every_ms, self.pause_ms = partial_every_ms, pause_ms
        self.start_utterance(0)

    def start_utterance(self, t_ns: int) -> None:
        """Speech started (confirmed) at `t_ns`: the first regular partial is due partial_every_ms later."""
        self.paused = False  # the user is silent and the pause partial was started
        self._last_ns = t_ns

    def due(self, t_ns: int, silence_ms: float, busy: bool, heard: bool = False) -> PartialKind | None:
        """The partial to start at the frame of `t_ns` (`silence_ms`: the endpointer's; `busy`: a partial
        is in flight), or None. `heard`: the last partial heard every word said and a reply runs on it,
        so the pause partial would add nothing but a decode beside that reply's prefill: there is none."""
        if silence_ms == 0.0:
            self.paused = False
        if silence_ms >= self.pause_ms:
            if self.paused or busy:
                return None
            self.paused = True
            return None if heard else "pause"
        if silence_ms > 0.0 or busy or t_ns - self._last_ns < self.partial_every_ms * 1_000_000:
            return None
        self._last_ns = t_ns
        return "regular"


def final_trailing_ms(end_ns: int, speech_end_ns: int, stood_in_ns: int | None = None) -> float:
    """What the final is told of the audio up to `end_ns` (the end of the frame that confirmed the end of
    speech): how much of its end holds no words. That is the audio after the last voiced frame
    (`speech_end_ns`); when a partial that heard every word stood in for the pause partial, having heard
    the audio up to `stood_in_ns`, it is all the audio after that partial's, and the recogniser's margin
    more, so that the final is that partial."""
    trailing_ms = (end_ns - speech_end_ns) / 1e6
    if stood_in_ns is None:
        return trailing_ms
    return max(trailing_ms, (end_ns - stood_in_ns) / 1e6 + 1000 * FINAL_MARGIN_S)
