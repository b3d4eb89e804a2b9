"""Turn-taking: how long a silence ends the user's turn, from the end-of-turn score of the words heard so far.

A fixed silence rule (VOICEAGENT_END_SILENCE_MS, 320 ms) makes every finished question wait 320 ms and cuts
every sentence with a longer pause in it. With a scoring LLM (`voiceagent.llm.TurnScoringLLM`: the engine in
this process) each partial transcript gets P(turn complete) from a model's warm cache (the draft's, or
the target's: VOICEAGENT_TURN_SCORE_MODEL; engine/turn_end.py), and the endpointer's
wait follows it:

- score >= `complete_score` (0.4): the words end a turn; `complete_silence_ms` (120) of silence ends it.
- score <= `incomplete_score` (0.01): the user stopped mid-sentence; wait `incomplete_silence_ms` (2000),
  then end the turn anyway (they may have finished after all).
- in between: a wait between the two, log-linear in the score.
- a score from a partial that heard less than `settled_silence_ms` (100) of silence after the words (the
  first pause partial, at 32 ms of quiet) ends the turn after `complete_silence_ms` only at or above
  `early_complete_score` (0.5); below it the wait is at least `pending_silence_ms`, time for the late
  pause partial (voiceagent/partials.py), which hears the silence and often a mark it implies ("Pack a
  toothbrush a towel" becomes "Pack a toothbrush, a towel,"), to be decoded and scored. A recogniser that
  has heard little silence misreads more, and a misread fragment may look finished ("Call me Mercandlier
  of heaven." 0.51, for "Call me back on zero seven ..." paused in). 0.6 until 2026-12-06; 0.5 with the
  pause partial on the quiet tail ended finished questions in ~140 ms p50 instead of ~270
  (bench/results/2026-12-06-cpu-xeon-amx-167-turn-taking-quiet.md). Until 2026-12-07 only scores from
  `complete_score` up waited so; an unsettled score just under it ("Turn off the lights and lock them"
  0.40, "My account number is one ate." 0.22) then ended the turn after its log-linear wait (120-420 ms)
  before the late partial's lower score came on a loaded CPU, and cut the pause
  (bench/results/2026-12-07-cpu-xeon-amx-167-unsettled.md).
- the words' end, for the two rules above and the next: where the level fell (`Endpointer.last_loud_ns`),
  which Silero's voiced chunks overrun by ~100 ms over a microphone's noise.
- words heard after the scored ones (the user spoke on after the partial's audio, by more than
  `heard_slack_ms`, 80): never less than `pending_silence_ms` (500), long enough for the partial at the
  pause and its score to arrive, since a finished-looking fragment ("I'd like a pizza" ... "and") must
  not end the turn on its own.
- while a partial is still being decoded or scored, a wait that is `pending_silence_ms` only to let its
  score come (none yet, words after the scored ones, an unsettled score) holds at
  `incomplete_silence_ms`: on a loaded CPU a pass and its score take longer than 500 ms, and ending the
  turn without the score cut off pauses it would have kept.
- words ending in two or more digits or digits' words (a number being dictated, paused in): as
  incomplete (`digits_wait`).
- a partial that heard every word said and found none (a breath, a cough, a first word too short to read
  yet): `incomplete_silence_ms` until words are scored. Nothing would be answered yet, and a pause just
  after the first word must not end the turn on the pending wait.
- words the recogniser was unsure of (a token of the partial it picked with a probability under
  `unsure_probability`, 0.15; Moonshine says, Whisper does not): at least `unsure_silence_ms` (500, the
  pending wait: time for the late pause partial to read the words again). A misheard pause reads as
  nonsense that may score finished ("Call me Mercandlier of heaven." 0.51, for "Call me back on zero
  seven ..." paused in, its least token probability 0.07-0.16), while finished questions heard right held
  0.35-0.93. At 0.15 / 500 ms, replayed on five recordings of the turn-taking clips (four clean, one
  over -50 dBFS noise), it changed 7 of 460 clip outcomes: 5 pauses no longer cut, one list and one
  pause ending 80-180 ms later, no finished question changed; at 0.25 / 1000 ms (tried first, opt-in
  then) it slowed the ends of misheard sentences and, over noise, where Moonshine is less sure of every
  word, finished questions (142 -> 178 ms p50; bench/results/2026-12-06-cpu-xeon-amx-167-unsure-words.md,
  bench/results/2026-12-06-cpu-xeon-amx-167-unsure-pending.md). 0: off.
- no score (a remote LLM, an engine busy with a reply, or VOICEAGENT_TURN_SCORE=0): the silence rule.

`EndOfTurnWait` keeps one utterance's latest score and says the wait at any moment; the session sets the
endpointer's wait from it (`Endpointer.set_end_silence_ms`) on every frame. The defaults are what
bench/turn_taking chose on its tuning clips on 2026-12-01 with Moonshine partials
(bench/results/2026-12-01-cpu-turn-taking-moonshine.md; the clips tuned on are not the clips reported on).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from voiceagent.config import Settings

__all__ = ["EndOfTurnWait", "TurnTakingOptions", "end_silence_ms", "fused_score", "heard_all"]


@dataclass(frozen=True)
class TurnTakingOptions:
    """The policy's thresholds and waits (the VOICEAGENT_TURN_* settings; see the module docstring)."""

    complete_score: float = 0.4  # a score at or above this ends the turn after complete_silence_ms
    incomplete_score: float = 0.01  # at or below this the turn waits incomplete_silence_ms
    complete_silence_ms: int = 120
    incomplete_silence_ms: int = 2000
    pending_silence_ms: int = 500  # the least wait while the latest words are not scored yet
    # A partial whose audio ends at most this long before the last voiced chunk still heard every word:
    # Silero's voiced chunks run on ~50-100 ms past the last loud sample of a word.
    heard_slack_ms: int = 80
    # Words that end in a digit may be a number being dictated ("call me back on 0 7 ..."), which people
    # pause inside and a language model cannot tell from a finished one: they wait as if incomplete.
    digits_wait: bool = True
    # A partial that heard less silence than this after the words must score early_complete_score to end
    # the turn quickly (see the module docstring).
    settled_silence_ms: int = 100
    early_complete_score: float = 0.5
    fallback_silence_ms: int = 320  # no score at all: the silence rule (VOICEAGENT_END_SILENCE_MS)
    # A partial with a token the recogniser picked at a probability below this waits at least
    # unsure_silence_ms (0: the rule is off).
    unsure_probability: float = 0.15
    unsure_silence_ms: int = 500
    # Smart Turn's audio probability beside the text score (`fused_score`); 0: the words alone.
    audio_weight: float = 0.0
    audio_bias: float = 2.0  # the audio's logit that leaves the text score as it is (p 0.88)

    def __post_init__(self) -> None:
        if not 0.0 < self.incomplete_score < self.complete_score <= self.early_complete_score <= 1.0:
            raise ValueError(
                "turn-taking scores need 0 < incomplete_score < complete_score <= early_complete_score <= 1, "
                f"got {self.incomplete_score}, {self.complete_score} and {self.early_complete_score}"
            )
        waits = (self.complete_silence_ms, self.pending_silence_ms, self.incomplete_silence_ms)
        others = (waits[1], self.fallback_silence_ms, self.heard_slack_ms, self.settled_silence_ms,
                  self.unsure_silence_ms)  # fmt: skip
        if not 0 <= waits[0] <= waits[2] or min(others) < 0:
            raise ValueError(
                "turn-taking waits need 0 <= complete_silence_ms <= incomplete_silence_ms and "
                f"non-negative pending, fallback, slack, settled and unsure times, got {waits}, {others[1:]}"
            )
        if not 0.0 <= self.unsure_probability <= 1.0:
            raise ValueError(f"turn-taking unsure_probability must be in [0, 1]: {self.unsure_probability}")
        if not 0.0 <= self.audio_weight <= 1.0 or not math.isfinite(self.audio_bias):
            raise ValueError(
                f"turn-taking audio_weight must be in [0, 1] and audio_bias finite, got {self.audio_weight} "
                f"and {self.audio_bias}"
            )

    @classmethod
    def from_settings(cls, settings: Settings) -> TurnTakingOptions:
        return cls(
            complete_score=settings.turn_complete_score,
            incomplete_score=settings.turn_incomplete_score,
            complete_silence_ms=settings.turn_complete_silence_ms,
            incomplete_silence_ms=settings.turn_incomplete_silence_ms,
            pending_silence_ms=settings.turn_pending_silence_ms,
            heard_slack_ms=settings.turn_heard_slack_ms,
            digits_wait=settings.turn_digits_wait,
            settled_silence_ms=settings.turn_settled_silence_ms,
            early_complete_score=settings.turn_early_complete_score,
            fallback_silence_ms=settings.end_silence_ms,
            audio_weight=settings.turn_audio_weight,
            audio_bias=settings.turn_audio_bias,
            unsure_probability=settings.turn_unsure_probability,
            unsure_silence_ms=settings.turn_unsure_silence_ms,
        )


DEFAULT_OPTIONS = TurnTakingOptions()
# Two or more digits or digits' words at the end (Moonshine writes dictated digits as words: "zero, seven."):
# a number being dictated. One alone ends many a finished request ("what is two plus two", "at 7").
_DIGIT = r"(?:\d|\b(?:zero|one|two|three|four|five|six|seven|eight|nine)\b)"
ENDS_IN_DIGIT = re.compile(_DIGIT + r"(?:[\s,.\-]*" + _DIGIT + r")+[\W_]*$", re.IGNORECASE)


_EDGE = 1e-6  # probabilities are kept this far from 0 and 1 before taking logits


def _check_probability(p: float, what: str = "") -> None:
    if not 0.0 <= p <= 1.0 or math.isnan(p):
        raise ValueError(f"an end-of-turn {what}score is a probability in [0, 1], got {p}")


def _logit(p: float) -> float:
    p = min(max(p, _EDGE), 1.0 - _EDGE)
    return math.log(p / (1.0 - p))


def fused_score(text: float, audio: float | None, options: TurnTakingOptions = DEFAULT_OPTIONS) -> float:
    """The end-of-turn score from the words' score and Smart Turn's audio probability (None: none):
    logit = logit(text) + audio_weight * (logit(audio) - audio_bias). The words decide; the audio moves the
    odds a little, up where the voice fell as at the end of a turn (above the bias's p, 0.88), down where
    it did not. Light on purpose: on its own the audio calls most mid-sentence pauses complete."""
    if audio is None or options.audio_weight == 0.0:
        return text
    _check_probability(text, "text ")
    _check_probability(audio, "audio ")
    z = _logit(text) + options.audio_weight * (_logit(audio) - options.audio_bias)
    return 1.0 / (1.0 + math.exp(-z))


def heard_all(heard_until_ns: int, last_voiced_ns: int, options: TurnTakingOptions = DEFAULT_OPTIONS) -> bool:
    """A partial whose audio ends at `heard_until_ns` heard every word said up to the endpointer's
    `last_voiced_ns()`, within the policy's `heard_slack_ms`."""
    return last_voiced_ns <= heard_until_ns + options.heard_slack_ms * 1_000_000


def end_silence_ms(
    score: float | None, options: TurnTakingOptions = DEFAULT_OPTIONS, *, heard_all: bool = True
) -> int:
    """The silence that should end the user's turn, given the latest end-of-turn score (None: none).

    `heard_all`: the scored partial heard every word said so far (its audio reaches the endpointer's
    `last_voiced_ns()`); if not, the wait is at least `pending_silence_ms`.
    """
    if score is None:
        return options.fallback_silence_ms
    _check_probability(score)
    if score >= options.complete_score:
        wait = options.complete_silence_ms
    elif score <= options.incomplete_score:
        wait = options.incomplete_silence_ms
    else:  # log-linear between the two thresholds
        span = math.log(options.complete_score) - math.log(options.incomplete_score)
        towards_complete = (math.log(score) - math.log(options.incomplete_score)) / span
        gap = options.incomplete_silence_ms - options.complete_silence_ms
        wait = round(options.incomplete_silence_ms - towards_complete * gap)
    return wait if heard_all else max(wait, options.pending_silence_ms)


class EndOfTurnWait:
    """One utterance's latest end-of-turn score and the audio it heard -> the wait that ends the turn now.

    Before any score the wait is `pending_silence_ms`; after the scorer gave None (busy or unable) with
    no score yet, the silence rule.
    """

    def __init__(self, options: TurnTakingOptions = DEFAULT_OPTIONS) -> None:
        self.options = options
        self.start_utterance()

    def start_utterance(self) -> None:
        """Forgets the last utterance's score (call at speech_start)."""
        self._score: float | None = None
        self._heard_until_ns = -1
        self._unscorable = False
        self._unsure = False  # the scored words hold one the recogniser was unsure of
        self._no_words_until_ns: int | None = None  # the audio end of a partial that heard no words

    def scored(
        self,
        score: float | None,
        heard_until_ns: int,
        text: str = "",
        audio_score: float | None = None,
        confidence: float | None = None,
    ) -> float | None:
        """A partial's score: `heard_until_ns`, the end of the audio that partial decoded (the time of the
        last frame pushed before it started, plus the frame); `text`, the words scored (for `digits_wait`);
        `audio_score`, Smart Turn's probability on that audio (None: none), fused with the words' score
        (`fused_score`); `confidence`, the recogniser's least token probability in the partial (None: not
        known; see `unsure_probability`). None (no score) keeps an earlier score. Returns the score the
        wait follows."""
        if score is None:
            self._unscorable = self._score is None
            return None
        _check_probability(score)
        score = fused_score(score, audio_score, self.options)
        if self.options.digits_wait and ENDS_IN_DIGIT.search(text):
            score = min(score, self.options.incomplete_score)
        self._score, self._heard_until_ns, self._unscorable = score, heard_until_ns, False
        self._unsure = confidence is not None and confidence < self.options.unsure_probability
        return score

    def heard_no_words(self, heard_until_ns: int) -> None:
        """A partial that decoded the audio up to `heard_until_ns` and found no words: until words are
        scored, and while it still heard everything, the wait is `incomplete_silence_ms`."""
        if self._score is None:
            self._no_words_until_ns = heard_until_ns

    def wait_ms(self, words_end_ns: int, scoring: bool = False) -> int:
        """The silence that ends the turn, given where the words heard so far end (`words_end_ns`: the
        session passes the endpointer's `last_loud_ns()`, where the quiet tail starts: over a microphone's
        noise Silero's voiced chunks run on ~100 ms past the words, and a pause partial that started on the
        quiet tail would otherwise never have heard them all nor settled). `scoring`: a partial
        is being decoded or scored now. A wait raised to `pending_silence_ms` only to let a coming score
        arrive is then held at `incomplete_silence_ms` until it does: on a loaded CPU a decode and its
        score can take longer than the pending wait (bench/results/2026-12-03-cpu-xeon-amx-held-wait.md),
        and ending the turn without the score cut off pauses that it would have kept."""
        wait, awaiting = self._wait_ms(words_end_ns)
        if scoring and awaiting:
            return max(wait, self.options.incomplete_silence_ms)
        return wait

    def _wait_ms(self, words_end_ns: int) -> tuple[int, bool]:
        """The wait, and whether it only waits for a score to come (the pending wait)."""
        options = self.options
        if self._score is None:
            silent = self._no_words_until_ns
            if silent is not None and heard_all(silent, words_end_ns, options):
                return options.incomplete_silence_ms, False
            if self._unscorable:
                return options.fallback_silence_ms, False
            return options.pending_silence_ms, True
        heard = heard_all(self._heard_until_ns, words_end_ns, options)
        wait = end_silence_ms(self._score, options)
        settled = self._heard_until_ns - words_end_ns >= options.settled_silence_ms * 1_000_000
        unsettled = not settled and self._score < options.early_complete_score
        if (not heard or unsettled) and wait < options.pending_silence_ms:
            return options.pending_silence_ms, True
        if self._unsure:
            wait = max(wait, options.unsure_silence_ms)
        return wait, False
