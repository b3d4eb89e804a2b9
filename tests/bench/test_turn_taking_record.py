"""The turn-taking bench's recording runs the session's head start as the session does: a regular partial
that returns after the user spoke on feeds its words to the draft only (`prefill(draft_only=True)`) and
only while Silero still hears speech; that forward does not hold up the next partial's decode, only the
next score, which waits for it (the engine runs one job at a time). And it stops a regular partial that
could not end the turn when the pause partial falls due, as the session does."""

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.turn_taking.clips import LEAD_S, Clip, espeak_with_breaks
from bench.turn_taking.ours import FRAME_NS, record
from tests.fakes import FakeLLM, FakeRecognizer, FakeTranscript, StoppableFakeRecognizer
from voiceagent.audio import SAMPLE_RATE, write_wav
from voiceagent.turn_taking import TurnTakingOptions

DECODE_S, PREFILL_S, SCORE_S = 0.12, 0.25, 0.01
WORDS = "Is it going to rain tomorrow in the north of the country"


class SlowRecognizer(FakeRecognizer):
    """Hears WORDS as the fake does, each partial taking DECODE_S."""

    def __init__(self) -> None:
        super().__init__(WORDS)

    def decode_partial(self) -> FakeTranscript:
        time.sleep(DECODE_S)
        return super().decode_partial()


class SlowPrefillLLM(FakeLLM):
    """A forward of the user's words takes PREFILL_S, a score SCORE_S."""

    turn_head = False

    async def prefill(self, messages: Any, *, draft_only: bool = False) -> bool:
        await super().prefill(messages, draft_only=draft_only)
        await asyncio.sleep(PREFILL_S)
        return True

    async def end_of_turn_probability(self, messages: Any, **_: Any) -> float:
        await asyncio.sleep(SCORE_S)
        return 0.9


def spoken_clip(tmp_path: Path) -> Clip:
    speech = espeak_with_breaks(WORDS, [], tmp_path)
    lead, trail = np.zeros(int(LEAD_S * SAMPLE_RATE), np.int16), np.zeros(SAMPLE_RATE, np.int16)
    path = tmp_path / "clip.wav"
    write_wav(path, np.concatenate([lead, speech, trail]), SAMPLE_RATE)
    end_s = LEAD_S + len(speech) / SAMPLE_RATE
    return Clip("complete-test", "complete", "report", "espeak", WORDS, (), end_s, str(path))


def test_a_skipped_partials_head_start_holds_up_the_next_score_not_the_next_decode(tmp_path: Path) -> None:
    clip, llm = spoken_clip(tmp_path), SlowPrefillLLM()
    rec = asyncio.run(record(clip, SlowRecognizer(), llm, "system", pause_quiet_ms=32))  # type: ignore[arg-type]
    skipped = [s for s in rec.scored if s.skipped]
    fed = [s for s in skipped if s.prefill_s > 0]
    assert fed and all(draft_only for _, draft_only in llm.prefills), "the head start feeds the draft only"
    for s in skipped:  # known when its decode returned: the schedule is free again
        assert s.known_ns == s.heard_until_ns + int(s.asr_s * 1e9)
    assert all(s.heard_until_ns / 1e9 < clip.speech_end_s for s in fed), "fed while speech was heard"
    pairs = zip(rec.scored, rec.scored[1:], strict=False)
    held = [(a, b) for a, b in pairs if a.skipped and a.prefill_s > 0 and b.score_s > 0]
    assert held, "a score came right after a head start (its forward outlasts a decode)"
    for before, after in held:  # that score waited for the forward
        engine_free_ns = before.known_ns + int(before.prefill_s * 1e9)
        assert after.known_ns >= engine_free_ns + int(after.score_s * 1e9) - 1_000_000
    ended = [s for s in rec.scored if s.score is not None and s.heard_until_ns / 1e9 >= clip.speech_end_s]
    assert ended, "a pause partial heard the end and was scored"


LONG_DECODE_S = 0.35  # longer than the schedule's 300 ms: a partial is always in flight at the pause


class QuickLLM(FakeLLM):
    turn_head = False

    async def end_of_turn_probability(self, messages: Any, **_: Any) -> float:
        return 0.9


def test_a_partial_that_could_not_end_the_turn_is_stopped_when_the_pause_partial_falls_due(
    tmp_path: Path,
) -> None:
    clip = spoken_clip(tmp_path)
    recognizer, llm = StoppableFakeRecognizer(WORDS, LONG_DECODE_S), QuickLLM()
    rec = asyncio.run(record(clip, recognizer, llm, "system", pause_quiet_ms=32))  # type: ignore[arg-type]
    slack_ns = TurnTakingOptions().heard_slack_ms * 1_000_000
    stopped = [i for i, s in enumerate(rec.scored) if s.stopped]
    assert stopped, "a partial was in flight when the pause partial fell due"
    for i in stopped:  # (one may be in a short pause between words, where the next is a regular one)
        cut, after = rec.scored[i], rec.scored[i + 1]
        assert cut.skipped and cut.score is None and not cut.pause and cut.asr_s < LONG_DECODE_S - 0.05
        assert after.heard_until_ns <= cut.known_ns + 2 * FRAME_NS, "the next begun in the frame after"
        assert cut.heard_until_ns + slack_ns < after.heard_until_ns
    paused = [rec.scored[i + 1] for i in stopped if rec.scored[i + 1].pause]
    assert paused and all(p.score == 0.9 for p in paused), "a pause partial right after a stop, scored"
    assert all(s.asr_s >= LONG_DECODE_S for s in rec.scored if not s.stopped)
