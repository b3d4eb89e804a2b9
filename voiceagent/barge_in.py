"""False interruptions recover: a barge-in pauses the reply first, and only real words end it.

When the user starts to speak over the agent (the VAD's speech_start while a reply is being made or
played), the reply is *held*: its output events stop at the session's event stream at once (the transport
then plays out at most what it already has: the gateway keeps <= 100 ms ahead), while the LLM and TTS go
on making it. What the user turns out to have said decides:

- real words: the reply is interrupted as before (its queued audio is dropped, the history keeps the words
  heard up to the pause) and the user's words are answered. A partial decides only when it holds more
  words than a backchannel (over `MAX_BACKCHANNEL_WORDS`) or a word that asks the agent to stop ("stop",
  "wait", "no", ...): a recogniser that has heard half a second of a hum misreads it as short words ("in a
  map", "And and", "Out" for Piper's and espeak-ng's "Mm-hmm" and "Uh-huh", bench/turn_taking), which
  the final, with all the audio, reads as the hum it is. Until the final, such a reply stays paused;
- a final with no words or only backchannels ("mm-hmm", "yeah", "okay"; a cough that Whisper writes as
  nothing or "(coughs)"): the reply resumes where it paused and the history is unchanged;
- no words at all within `resume_after_ms` (1 s) of the pause: the reply resumes anyway; real words heard
  later still interrupt it.

`HeldReply` is the session's record of one held reply; `is_backchannel` the words rule, `interrupts` when
a transcript decides.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from voiceagent.clock import Clock
from voiceagent.events import Event, InterruptibleEvent, ReplyPaused, ReplyResumed
from voiceagent.trace import TURN_PAUSED, TURN_RESUMED, Trace

# Words that acknowledge without taking the turn. Matched on whole transcripts, case and punctuation
# aside, so "yeah" resumes the reply while "yeah but what about Tuesday" interrupts it.
BACKCHANNEL_WORDS = frozenset(
    {
        "mm", "mmm", "mhm", "mmhmm", "mm-hmm", "hmm", "hm", "uh-huh", "uh", "huh", "um", "ah", "oh", "yeah",
        "yes", "yep", "yup", "ok", "okay", "right", "sure", "alright", "i", "see", "got", "it", "cool",
        "nice", "wow", "true", "exactly", "totally", "good", "great",
    }
)  # fmt: skip
_NOISE = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*")  # Whisper's "(coughs)", "[MUSIC]", "*sighs*"
MAX_BACKCHANNEL_WORDS = 3
# Words that ask the agent to stop talking: a partial that holds one interrupts however short it is.
STOP_WORDS = frozenset(
    {"stop", "wait", "hold", "hang", "pause", "no", "sorry", "excuse", "enough", "cancel", "quiet", "shut"}
)


_HUM = re.compile(r"[mhnu]{1,8}")  # how Whisper spells a hum: "mm", "mmmm", "nm", "mhm", "uhuh", "n m"


def _acknowledges(word: str) -> bool:
    word = word.strip("-'")
    return word in BACKCHANNEL_WORDS or _HUM.fullmatch(word.replace("-", "")) is not None


def is_backchannel(text: str) -> bool:
    """True for a transcript without real words: empty, noise only, or up to three backchannel words
    (hums included, however Whisper spells them)."""
    return _only_backchannel(_words(text))


def interrupts(text: str, *, final: bool) -> bool:
    """Whether a transcript of speech over the reply ends it: a final with real words; a partial with real
    words only if it holds more than `MAX_BACKCHANNEL_WORDS` words or one of `STOP_WORDS` (a shorter one
    may be a misread hum: the final decides)."""
    words = _words(text)
    if _only_backchannel(words):
        return False
    return final or len(words) > MAX_BACKCHANNEL_WORDS or any(w.strip("-'") in STOP_WORDS for w in words)


def _only_backchannel(words: list[str]) -> bool:
    return len(words) <= MAX_BACKCHANNEL_WORDS and all(_acknowledges(w) for w in words)


def _words(text: str) -> list[str]:
    return re.findall(r"[\w'-]+", _NOISE.sub(" ", text.lower()))


@dataclass
class HeldReply:
    """A reply paused by a possible barge-in: its task goes on; its output events wait in `queued`."""

    turn: int
    task: asyncio.Task[None] | None
    paused_ns: int  # when the user's speech paused it (the frame's time)
    paused: bool = True
    heard_words: bool = False  # a partial heard words too few to decide: the final decides, not the timer
    queued: deque[Event] = field(default_factory=deque)

    def alive(self) -> bool:
        return self.task is not None and not self.task.done()


class BargeIns:
    """A session's barge-ins: holds the reply at the user's speech_start, then interrupts or resumes it.

    `interrupt(turn, task)` is the session's own barge-in (cancel the reply's task, keep the heard words,
    emit `Interrupted`); `playing(turn)` says whether the transport has yet to play some of its audio.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        trace: Trace,
        events: asyncio.Queue[Event | None],
        interrupt: Callable[[int, asyncio.Task[None] | None], None],
        playing: Callable[[int], bool],
        resume_after_ms: float | None,
    ) -> None:
        self.clock, self.trace, self.events, self.playing = clock, trace, events, playing
        self._interrupt, self.resume_after_ms = interrupt, resume_after_ms
        self.held: HeldReply | None = None

    @property
    def enabled(self) -> bool:
        return self.resume_after_ms is not None

    def hold(self, turn: int, task: asyncio.Task[None] | None, t_ns: int) -> None:
        """The user started to speak over the reply of `turn` (made by `task`) at `t_ns`: its output
        waits from now on. Speech over a reply already held and resumed pauses that one again."""
        held = self.current()
        if held is None:
            held = self.held = HeldReply(turn, task, t_ns)
        elif held.paused:
            return
        held.paused, held.paused_ns, held.heard_words = True, t_ns, False
        self.events.put_nowait(ReplyPaused(self.clock.now_ns(), turn))
        self.trace.write(TURN_PAUSED, turn)

    def tick(self, t_ns: int) -> None:
        """An input frame at `t_ns`: a reply paused for resume_after_ms without words goes on."""
        held = self.held
        if held is not None and held.paused and not held.heard_words and self.resume_after_ms is not None:
            if t_ns - held.paused_ns >= self.resume_after_ms * 1_000_000:
                self.resume("no words in time")

    def holds_back(self, event: Event) -> bool:
        """True if `event` belongs to the paused reply: it is kept until the reply resumes or is dropped."""
        held = self.held
        if held is None or not held.paused or event.turn_id != held.turn:
            return False
        if not isinstance(event, InterruptibleEvent):
            return False
        held.queued.append(event)
        return True

    def heard(self, text: str, *, final: bool) -> bool:
        """The interrupting utterance's transcript so far (`final`: all of it). Real words end the held
        reply (`Interrupted`; a partial's only when `interrupts` says so); a final without them lets it go on,
        and True says it is not to be answered."""
        held = self.current()
        if held is None:
            return False
        if interrupts(text, final=final):
            self.drop()
            self._interrupt(held.turn, held.task)
            return False
        if final:
            self.resume("no words" if not text.strip() else "backchannel", text)
            return True
        if not is_backchannel(text):
            held.heard_words = True
        return False

    def resume(self, reason: str, text: str = "") -> None:
        """The reply goes on where it paused (its held events first), the history unchanged."""
        held = self.held
        if held is None or not held.paused:
            return
        held.paused = False
        pending = []  # the session's events not yet taken: after the resumed reply's held ones
        while not self.events.empty():
            pending.append(self.events.get_nowait())
        for event in [ReplyResumed(self.clock.now_ns(), held.turn), *held.queued, *pending]:
            self.events.put_nowait(event)
        held.queued.clear()
        self.trace.write(TURN_RESUMED, held.turn, reason=reason, text=text)

    def current(self) -> HeldReply | None:
        """The held (or resumed) reply while it is still being made or played; else None."""
        held = self.held
        if held is not None and not (held.alive() or held.queued or self.playing(held.turn)):
            self.drop()
            return None
        return held

    def replying(self) -> bool:
        """A held reply is still being made, or its audio is still to be played."""
        return self.current() is not None

    def forget(self) -> asyncio.Task[None] | None:
        """Drops the held reply (see `drop`); returns its task if it is still being made or played."""
        held = self.current()
        self.drop()
        return held.task if held is not None else None

    def drop(self) -> None:
        """The held reply is interrupted, over, or the session closes: forget it (and its queued events)."""
        self.held = None
