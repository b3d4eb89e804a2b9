"""When a session decodes a partial transcript: on a schedule while the user speaks, once when they pause.

While the user speaks, a partial every `partial_every_ms`. Once they have been silent `pause_ms` (32: the
first chunk Silero scores silent), the pause partial: it hears the whole utterance, so its score may end
the turn at once, the reply may start on it and the final reuse it. Once they have been silent
`late_pause_ms` (128; 0: none), a second one, if the turn has not ended by then: the recogniser punctuates
what it heard by the silence after it ("Pack a toothbrush a towel" at 32 ms, "Pack a toothbrush, a towel,"
at 128), and that comma tells a list in progress from a finished request. A turn whose words scored
complete ends before it is due. No partial between them or after them until the user speaks again: it
would hear nothing new. One partial at a time: `PartialSchedule` only says which to start, given that none
is in flight; one that was due while another ran starts as soon as that returns, and counts for every
pause stage its silence has passed; but a partial still decoding when a pause partial falls due, whose
audio ends before the last words (a regular one, or one begun at an earlier pause the user spoke on past:
it could not end the turn), is stopped (`pause_due`, `StoppableRecognizer`) so that the pause partial
starts at once. A partial that returned in the silence having heard every word, and started the reply,
stands in for the first pause partial (voiceagent/session.py), not for the late one.
With `pause_quiet_ms` set, the first pause partial also starts once the audio has been quiet that long
(`Endpointer.quiet_ms`: the level fell to the noise floor, ~96 ms ahead of Silero's silence over a
microphone's noise), so its score can come sooner; the pause lasts until the audio is loud again.
"""

from __future__ import annotations

from typing import Literal

from voiceagent.stages import FINAL_MARGIN_S

__all__ = ["PartialKind", "PartialSchedule", "final_trailing_ms", "words_ahead"]

PartialKind = Literal["regular", "pause"]


class PartialSchedule:
    """One session's partial schedule (see the module docstring); times in ns, silences in ms."""

    def __init__(
        self, partial_every_ms: int, pause_ms: int, late_pause_ms: int = 0, pause_quiet_ms: int = 0
    ) -> None:
        if late_pause_ms and late_pause_ms <= pause_ms:
            raise ValueError(f"late_pause_ms ({late_pause_ms}) must exceed pause_ms ({pause_ms}), or be 0")
        if pause_quiet_ms < 0:
            raise ValueError(f"pause_quiet_ms must be >= 0 (0: none), got {pause_quiet_ms}")
        self.partial_every_ms, self.pause_ms, self.pause_quiet_ms = partial_every_ms, pause_ms, pause_quiet_ms
        self._stages = (pause_ms, late_pause_ms) if late_pause_ms else (pause_ms,)
        self.start_utterance(0)

    def start_utterance(self, t_ns: int) -> None:
        """Speech started (confirmed) at `t_ns`: the first regular partial is due partial_every_ms later."""
        self._last_ns = t_ns
        self._stages_done = 0  # pause stages of this silence started (or stood in for)

    @property
    def paused(self) -> bool:
        """The user is silent and a pause partial was started (or stood in for) in this silence."""
        return self._stages_done > 0

    def due(
        self, t_ns: int, silence_ms: float, busy: bool, heard: bool = False, quiet_ms: float = 0.0
    ) -> PartialKind | None:
        """The partial to start at the frame of `t_ns` (`silence_ms`, `quiet_ms`: the endpointer's; `busy`:
        a partial is in flight), or None. `heard`: the last partial heard every word said and a reply runs
        on it, so the first pause partial would add nothing but a decode beside that reply's prefill: there
        is none (the late one is still due)."""
        if not self.silent(silence_ms, quiet_ms):
            self._stages_done = 0
        else:
            passed = self._stages_passed(silence_ms, quiet_ms)
            if busy or passed <= self._stages_done:
                return None
            stands_in = heard and self._stages_done == 0  # for the first pause partial only
            self._stages_done = 1 if stands_in else passed
            return None if stands_in else "pause"
        if busy or t_ns - self._last_ns < self.partial_every_ms * 1_000_000:
            return None
        self._last_ns = t_ns
        return "regular"

    def pause_due(self, silence_ms: float, quiet_ms: float = 0.0, heard: bool = False) -> bool:
        """Whether `due` would start a pause partial now if none were in flight (it changes nothing): the
        session then stops a partial in flight that cannot have heard every word (it could not end the
        turn), so that the pause partial starts sooner."""
        if not self.silent(silence_ms, quiet_ms):
            return False
        if self._stages_passed(silence_ms, quiet_ms) <= self._stages_done:
            return False
        return not (heard and self._stages_done == 0)

    def _stages_passed(self, silence_ms: float, quiet_ms: float) -> int:
        passed = sum(1 for stage in self._stages if silence_ms >= stage)
        if self.pause_quiet_ms and quiet_ms >= self.pause_quiet_ms:
            passed = max(passed, 1)
        return passed

    def silent(self, silence_ms: float, quiet_ms: float = 0.0) -> bool:
        """The user is silent: Silero's silence, or with `pause_quiet_ms` a quiet tail that reached it or a
        pause partial started on it (until the audio is loud again). False: they spoke on."""
        if silence_ms > 0.0:
            return True
        if not self.pause_quiet_ms or quiet_ms == 0.0:
            return False
        return quiet_ms >= self.pause_quiet_ms or self._stages_done > 0


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


def words_ahead(stable: str, text: str) -> str:
    """The words a head start feeds while the user speaks: the partial's guess without its last word (the
    audio ends inside it, "cap" for "capital"), and never fewer than the stable words. The guess's words past
    the stable ones are usually right; a changed one costs its ids again, and the reply keeps the prefix."""
    guess = text.split()[:-1]
    if len(guess) <= len(stable.split()) or not text.startswith(stable):
        return stable
    return " ".join(guess).rstrip(" ,;:")
