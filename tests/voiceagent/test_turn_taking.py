"""The turn-taking policy: a finished sentence ends after a short silence, a cut one waits, no score keeps
the silence rule, and words the score has not heard yet never end the turn quickly."""

import math

import pytest

from voiceagent.config import Settings
from voiceagent.session_options import SessionOptions
from voiceagent.turn_taking import EndOfTurnWait, TurnTakingOptions, end_silence_ms, fused_score

OPTIONS = TurnTakingOptions()


def test_the_wait_follows_the_score() -> None:
    assert end_silence_ms(0.9) == OPTIONS.complete_silence_ms <= 150
    assert end_silence_ms(0.0) == OPTIONS.incomplete_silence_ms >= 1000
    low, high = OPTIONS.incomplete_score, OPTIONS.complete_score
    between = [end_silence_ms(low * (high / low) ** f) for f in (0.25, 0.5, 0.75)]
    assert OPTIONS.incomplete_silence_ms > between[0] > between[1] > between[2] > OPTIONS.complete_silence_ms


def test_no_score_is_the_silence_rule_and_unheard_words_wait_for_one() -> None:
    assert end_silence_ms(None) == OPTIONS.fallback_silence_ms == Settings().end_silence_ms
    assert end_silence_ms(0.9, heard_all=False) == OPTIONS.pending_silence_ms
    assert end_silence_ms(0.0, heard_all=False) == OPTIONS.incomplete_silence_ms


def test_settings_set_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICEAGENT_TURN_COMPLETE_SILENCE_MS", "90")
    monkeypatch.setenv("VOICEAGENT_END_SILENCE_MS", "400")
    options = TurnTakingOptions.from_settings(Settings())
    assert end_silence_ms(1.0, options) == 90 and end_silence_ms(None, options) == 400
    # the pause partial's quiet start (Pipeline.new_session): the setting's default is the session's
    assert Settings().turn_pause_quiet_ms == SessionOptions().pause_quiet_ms == 32
    monkeypatch.setenv("VOICEAGENT_TURN_PAUSE_QUIET_MS", "0")
    assert Settings().turn_pause_quiet_ms == 0
    unsure = TurnTakingOptions.from_settings(Settings()).unsure_probability
    assert unsure == OPTIONS.unsure_probability == 0.15
    monkeypatch.setenv("VOICEAGENT_TURN_UNSURE_PROBABILITY", "0.25")
    monkeypatch.setenv("VOICEAGENT_TURN_UNSURE_SILENCE_MS", "700")
    options = TurnTakingOptions.from_settings(Settings())
    assert options.unsure_probability == 0.25 and options.unsure_silence_ms == 700


def test_bad_options_and_scores_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="incomplete_score < complete_score"):
        TurnTakingOptions(complete_score=0.001, incomplete_score=0.01)
    with pytest.raises(ValueError, match="complete_silence_ms <= incomplete_silence_ms"):
        TurnTakingOptions(complete_silence_ms=2000, incomplete_silence_ms=1000)
    with pytest.raises(ValueError, match="probability"):
        end_silence_ms(1.5)


def test_an_utterance_waits_for_its_score_and_a_stale_score_cannot_end_it_quickly() -> None:
    wait = EndOfTurnWait()
    assert wait.wait_ms(words_end_ns=1_000) == OPTIONS.pending_silence_ms  # nothing scored yet
    wait.scored(0.9, heard_until_ns=2_000_000_000)
    assert wait.wait_ms(words_end_ns=1_980_000_000) == OPTIONS.complete_silence_ms  # it heard every word
    assert wait.wait_ms(words_end_ns=2_500_000_000) == OPTIONS.pending_silence_ms  # words came after it
    wait.scored(None, heard_until_ns=3_000_000_000)  # the engine was busy: the earlier score stands
    assert wait.wait_ms(words_end_ns=1_980_000_000) == OPTIONS.complete_silence_ms
    wait.start_utterance()
    wait.scored(None, heard_until_ns=4_000)
    assert wait.wait_ms(words_end_ns=3_900) == OPTIONS.fallback_silence_ms  # no score to be had


def test_a_number_being_dictated_waits_as_if_incomplete() -> None:
    wait = EndOfTurnWait()
    wait.scored(0.6, heard_until_ns=2_000, text="Call me back on 0 7")
    assert wait.wait_ms(words_end_ns=1_900) == OPTIONS.incomplete_silence_ms
    wait.scored(0.6, heard_until_ns=3_000, text="Call me back on 07912 please.")
    assert wait.wait_ms(words_end_ns=2_900) == OPTIONS.complete_silence_ms


def test_digits_spelled_as_words_wait_as_a_number_being_dictated() -> None:
    """Moonshine writes dictated digits as words ("Call me back on zero, seven."): they wait as digits do."""
    wait = EndOfTurnWait(OPTIONS)
    for text in ("Call me back on zero, seven.", "My account number is three, one, eight,", "My PIN is 4 7"):
        wait.start_utterance()
        wait.scored(0.9, heard_until_ns=10_000, text=text)
        assert wait.wait_ms(words_end_ns=9_000) == OPTIONS.incomplete_silence_ms, text
    for text in ("Is it done?", "What is two plus two", "Set an alarm for 7."):  # no number dictated
        wait.start_utterance()
        wait.scored(0.9, heard_until_ns=10_000, text=text)
        assert wait.wait_ms(words_end_ns=9_000) == OPTIONS.complete_silence_ms, text


def test_a_partial_that_heard_no_words_keeps_the_turn_open() -> None:
    """A pause just after the first word, decoded before the recogniser can read it: nothing would be
    answered, so the turn waits as if incomplete (not the pending wait), until words are scored."""
    wait = EndOfTurnWait()
    wait.heard_no_words(heard_until_ns=1_000_000_000)
    assert wait.wait_ms(words_end_ns=990_000_000) == OPTIONS.incomplete_silence_ms
    assert wait.wait_ms(words_end_ns=1_500_000_000) == OPTIONS.pending_silence_ms  # spoke on since
    wait.scored(0.9, heard_until_ns=2_000_000_000, text="Hello there")
    wait.heard_no_words(heard_until_ns=2_100_000_000)  # words were scored: an empty pass changes nothing
    assert wait.wait_ms(words_end_ns=1_990_000_000) == OPTIONS.complete_silence_ms


def test_a_partial_that_heard_little_silence_needs_a_surer_score_to_end_the_turn_quickly() -> None:
    """The pause partial at the first silent chunk misreads more than the late one: below
    early_complete_score its words wait for the late partial's score (the pending wait), unless they
    already wait longer."""
    ms = 1_000_000
    last_voiced = 2_000 * ms
    wait = EndOfTurnWait()
    wait.scored(0.45, heard_until_ns=last_voiced + 40 * ms, text="Call me Mercandlier of heaven.")
    assert wait.wait_ms(last_voiced) == OPTIONS.pending_silence_ms  # heard 40 ms of silence: not settled
    wait.scored(0.9, heard_until_ns=last_voiced + 40 * ms, text="What is the capital of France?")
    assert wait.wait_ms(last_voiced) == OPTIONS.complete_silence_ms  # sure enough at once
    wait.scored(0.45, heard_until_ns=last_voiced + 140 * ms, text="Play some relaxing music.")
    assert wait.wait_ms(last_voiced) == OPTIONS.complete_silence_ms  # the late partial heard the silence
    assert OPTIONS.complete_score <= 0.45 < OPTIONS.early_complete_score
    wait.scored(0.22, heard_until_ns=last_voiced + 40 * ms, text="My account number is one ate.")
    in_between = end_silence_ms(0.22)
    assert in_between < OPTIONS.pending_silence_ms  # alone, it would end the turn before the late partial
    assert wait.wait_ms(last_voiced) == OPTIONS.pending_silence_ms
    assert wait.wait_ms(last_voiced, scoring=True) == OPTIONS.incomplete_silence_ms  # held for that partial
    wait.scored(0.22, heard_until_ns=last_voiced + 140 * ms, text="My account number is one ate.")
    assert wait.wait_ms(last_voiced, scoring=True) == in_between  # settled: its own wait
    wait.scored(0.02, heard_until_ns=last_voiced + 40 * ms, text="Turn off the lights and")
    assert wait.wait_ms(last_voiced) == end_silence_ms(0.02) > OPTIONS.pending_silence_ms  # longer already
    with pytest.raises(ValueError, match="early_complete_score"):
        TurnTakingOptions(complete_score=0.5, early_complete_score=0.4)


def test_words_the_recogniser_was_unsure_of_never_end_the_turn_quickly() -> None:
    """A misheard pause reads as nonsense that may score finished; below `unsure_probability` the wait is
    at least `unsure_silence_ms` (by default the pending wait, time for the late pause partial), whatever
    the score. A recogniser that does not say (None), a sure one, and the rule off (0) are as before."""
    ms = 1_000_000
    last_voiced = 2_000 * ms
    heard = last_voiced + 140 * ms  # the late pause partial: settled
    wait = EndOfTurnWait()
    wait.scored(0.51, heard, text="Call me Mercandlier of heaven.", confidence=0.12)
    assert wait.wait_ms(last_voiced) == OPTIONS.unsure_silence_ms == OPTIONS.pending_silence_ms
    wait.scored(0.46, heard, text="Call me mcunzier of heaven.", confidence=0.2)  # over the default
    assert wait.wait_ms(last_voiced) == OPTIONS.complete_silence_ms
    wait = EndOfTurnWait(TurnTakingOptions(unsure_probability=0.25, unsure_silence_ms=1000))
    wait.scored(0.46, heard, text="Call me mcunzier of heaven.", confidence=0.15)
    assert wait.wait_ms(last_voiced) == 1000
    wait.scored(0.46, heard, text="Call me back tomorrow.", confidence=0.8)
    assert wait.wait_ms(last_voiced) == OPTIONS.complete_silence_ms
    wait.scored(0.46, heard, text="Call me mcunzier of heaven.", confidence=None)
    assert wait.wait_ms(last_voiced) == OPTIONS.complete_silence_ms
    wait.scored(0.001, heard, text="Call me mcunzier of", confidence=0.1)  # a longer wait stands
    assert wait.wait_ms(last_voiced) == OPTIONS.incomplete_silence_ms
    off = EndOfTurnWait(TurnTakingOptions(unsure_probability=0.0))
    off.scored(0.46, heard, text="Call me mcunzier of heaven.", confidence=0.1)
    assert off.wait_ms(last_voiced) == OPTIONS.complete_silence_ms
    with pytest.raises(ValueError, match="unsure_probability"):
        TurnTakingOptions(unsure_probability=1.5)


def test_a_wait_for_a_coming_score_is_held_while_a_partial_decodes() -> None:
    """The pending wait is time for a partial's score to come; while one is still being decoded or scored
    (a loaded CPU) it holds at the incomplete wait. A wait the score itself says is never held."""
    ms = 1_000_000
    wait = EndOfTurnWait()
    assert wait.wait_ms(1_000 * ms, scoring=True) == OPTIONS.incomplete_silence_ms  # no score yet
    assert wait.wait_ms(1_000 * ms, scoring=False) == OPTIONS.pending_silence_ms
    wait.scored(0.9, heard_until_ns=2_000 * ms)
    assert wait.wait_ms(1_980 * ms, scoring=True) == OPTIONS.complete_silence_ms  # heard it all: no hold
    assert wait.wait_ms(2_500 * ms, scoring=True) == OPTIONS.incomplete_silence_ms  # words came after it
    assert wait.wait_ms(2_500 * ms, scoring=False) == OPTIONS.pending_silence_ms
    wait.scored(0.45, heard_until_ns=3_000 * ms)  # finished-looking, but heard little silence (unsettled)
    assert wait.wait_ms(2_990 * ms, scoring=True) == OPTIONS.incomplete_silence_ms
    assert wait.wait_ms(2_990 * ms, scoring=False) == OPTIONS.pending_silence_ms
    wait.scored(0.02, heard_until_ns=4_000 * ms)  # a graded wait longer than the pending one: as it is
    graded = end_silence_ms(0.02)
    assert graded > OPTIONS.pending_silence_ms and wait.wait_ms(3_990 * ms, scoring=True) == graded


def test_the_audio_moves_the_words_score_a_little_and_only_when_weighed() -> None:
    weighed = TurnTakingOptions(audio_weight=0.25, audio_bias=2.0)
    assert fused_score(0.3, 0.99) == 0.3  # the default policy weighs the words alone
    assert fused_score(0.3, None, weighed) == 0.3
    at_bias = 1 / (1 + math.exp(-2.0))  # Smart Turn's p that leaves the words' odds as they are
    assert fused_score(0.3, at_bias, weighed) == pytest.approx(0.3)
    assert 0.3 < fused_score(0.3, 0.99, weighed) < 0.5  # a falling voice tips a doubtful sentence ...
    assert fused_score(0.001, 0.999, weighed) < OPTIONS.incomplete_score * 1.5  # ... not a cut one
    assert fused_score(0.5, 0.05, weighed) < 0.3  # a voice that did not fall lowers the odds
    assert fused_score(0.0, 1.0, weighed) < 1e-3 and fused_score(1.0, 0.0, weighed) > 0.99  # finite
    with pytest.raises(ValueError, match="audio score"):
        fused_score(0.3, 1.5, weighed)
    with pytest.raises(ValueError, match="audio_weight"):
        TurnTakingOptions(audio_weight=2.0)


def test_the_wait_follows_the_fused_score() -> None:
    weighed = TurnTakingOptions(audio_weight=0.25)
    wait = EndOfTurnWait(weighed)
    fused = wait.scored(0.3, heard_until_ns=10**9, text="can you recommend a good book", audio_score=0.99)
    assert fused is not None and fused >= weighed.complete_score
    assert wait.wait_ms(words_end_ns=10**9 - 200_000_000) == weighed.complete_silence_ms
    words_only = EndOfTurnWait(TurnTakingOptions())
    assert words_only.scored(0.3, 10**9, "can you recommend a good book", audio_score=0.99) == 0.3
    assert words_only.wait_ms(words_end_ns=10**9 - 200_000_000) > weighed.complete_silence_ms
    # Dictated digits still wait, whatever the voice did.
    assert wait.scored(0.9, 10**9, "call me back on zero seven", audio_score=0.99) == weighed.incomplete_score


def test_settings_weigh_the_audio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICEAGENT_TURN_AUDIO_WEIGHT", "0.5")
    monkeypatch.setenv("VOICEAGENT_TURN_AUDIO_BIAS", "1.5")
    options = TurnTakingOptions.from_settings(Settings())
    assert (options.audio_weight, options.audio_bias) == (0.5, 1.5)
