"""The session's end of turn: the endpointer's silence wait set from the end-of-turn score of the words.

Each partial transcript is scored (`TurnScoringLLM.end_of_turn_probability`: one forward on a warm cache,
the draft's unless VOICEAGENT_TURN_SCORE_MODEL says otherwise, engine/turn_end.py) and `EndOfTurnWait`
(voiceagent/turn_taking.py) turns the latest score into the silence that ends the turn; every input frame
sets it on the endpointer before the endpointer hears the frame. A partial with the same words as the one
scored last (a later pass that heard them all) takes its score again without a forward. Before a partial
is scored, a preemptive reply to other words is stopped, so the LLM is free. Without a scoring LLM (a
remote server) or with `SessionOptions.turn_taking` None, the endpointer keeps its fixed silence rule. With
an audio scorer (Smart Turn, voiceagent/smart_turn.py) and a policy that weighs it (`audio_weight` > 0), the
partial's audio is scored too, in the CPU lane, and the two are fused (turn_taking.py `fused_score`). Each
score is traced (`turn.score`: the words' score, the audio's, the fused one, their cost, the wait).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from voiceagent.clock import Clock
from voiceagent.llm import LLM, Message, TurnScoringLLM
from voiceagent.stages import EndpointerLike
from voiceagent.trace import TURN_SCORE, Trace
from voiceagent.turn_taking import DEFAULT_OPTIONS, EndOfTurnWait, TurnTakingOptions, heard_all

# A turn's audio so far ([n] float32 16 kHz) -> P(turn complete), e.g. Smart Turn run in the CPU lane.
AudioScorer = Callable[[np.ndarray], Awaitable[float]]


def scored_words(text: str) -> list[str]:
    """What two partials must share to be the same words, whose score a later one takes again without a
    forward: case and punctuation aside."""
    return re.findall(r"[\w']+", text.lower())


class ScoredEndpointing:
    """Sets the endpointer's wait from the scores of an utterance's partials (see the module docstring)."""

    def __init__(
        self,
        llm: LLM,
        endpointer: EndpointerLike,
        options: TurnTakingOptions | None,
        clock: Clock,
        trace: Trace,
        audio_scorer: AudioScorer | None = None,
    ) -> None:
        self.endpointer, self.clock, self.trace, self.options = endpointer, clock, trace, options
        weighs_audio = options is not None and options.audio_weight > 0
        self.audio_scorer = audio_scorer if weighs_audio else None
        self.use(llm)

    def use(self, llm: LLM) -> None:
        """Scores with `llm` from now on (the silence rule if it cannot score)."""
        options = self.options
        self.scorer = llm if options is not None and isinstance(llm, TurnScoringLLM) else None
        self.wait = EndOfTurnWait(options) if self.scorer is not None and options is not None else None
        self.start_utterance()

    def start_utterance(self) -> None:
        self._scored_words: list[str] = []
        self._score: float | None = None
        if self.wait is not None:
            self.wait.start_utterance()

    def heard_all(self, heard_until_ns: int) -> bool:
        """A partial whose audio ends at `heard_until_ns` heard every word said so far (within the
        policy's `heard_slack_ms`; the default slack under the silence rule)."""
        return heard_all(heard_until_ns, self.endpointer.last_voiced_ns(), self.options or DEFAULT_OPTIONS)

    def before_frame(self, scoring: bool = False) -> None:
        """Called for each input frame before the endpointer hears it: the wait the latest score says
        (`scoring`: a partial is being decoded or scored, `EndOfTurnWait.wait_ms`).
        The wait of finished words (`complete_silence_ms`) only confirms that the sound stopped, and counts
        from where the audio went quiet (`Endpointer.quiet_ms`, ~96 ms ahead of Silero's silence over a
        noise floor); the longer ones are guesses at a pause's length and budgets for a partial's decode
        and score, tuned on Silero's silence, and count from it. Whether a scored partial heard every word
        and how much silence it heard after them are judged from the same quiet tail's start
        (`last_loud_ns`): the pause partial may start on it (SessionOptions.pause_quiet_ms)."""
        if self.wait is not None and self.options is not None:
            wait = self.wait.wait_ms(self.endpointer.last_loud_ns(), scoring=scoring)
            from_quiet = wait <= self.options.complete_silence_ms
            self.endpointer.set_end_silence_ms(wait, from_quiet=from_quiet)

    async def score(
        self,
        turn: int,
        messages: Sequence[Message],
        heard_until_ns: int,
        audio: np.ndarray | None = None,
        confidence: float | None = None,
        *,
        reply_next: bool = False,
    ) -> None:
        """Scores a partial (the history and the words it heard, up to `heard_until_ns` of audio; `audio`,
        that audio, for the audio scorer; `confidence`, the recogniser's least token probability in it;
        `reply_next`: a reply to `messages` is started next, whose start the score may compute)."""
        if self.scorer is None or self.wait is None:
            return
        if not messages[-1]["content"].strip():  # it heard every word said, and there was none
            self.wait.heard_no_words(heard_until_ns)
            return
        started = self.clock.now_ns()
        audio_score = None
        if self.audio_scorer is not None and audio is not None and audio.size:
            audio_score = await self.audio_scorer(audio)
        audio_ms = (self.clock.now_ns() - started) / 1e6
        words = scored_words(messages[-1]["content"])
        if words == self._scored_words and self._score is not None:
            score: float | None = self._score  # the same words heard again, further on: the same score
        else:
            score = await self.scorer.end_of_turn_probability(messages, reply_next=reply_next)
        if score is not None:
            self._scored_words, self._score = words, score
        text = messages[-1]["content"]
        fused = self.wait.scored(score, heard_until_ns, text, audio_score=audio_score, confidence=confidence)
        wait = self.wait.wait_ms(self.endpointer.last_loud_ns())
        ms = (self.clock.now_ns() - started) / 1e6
        self.trace.write(
            TURN_SCORE, turn, score=score, ms=ms, wait_ms=wait, audio_score=audio_score, fused=fused,
            audio_ms=audio_ms if audio_score is not None else None, confidence=confidence,
        )  # fmt: skip
