"""The partial schedule: regular partials while the user speaks, one at the pause and one later in it."""

from __future__ import annotations

import pytest

from voiceagent.partials import PartialSchedule, final_trailing_ms
from voiceagent.stages import FINAL_MARGIN_S

MS = 1_000_000


def test_regular_partials_while_speaking_one_at_the_pause_then_none() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=100)
    schedule.start_utterance(0)
    assert schedule.due(200 * MS, 0.0, busy=False) is None  # not due yet
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(600 * MS, 0.0, busy=True) is None  # one in flight
    assert schedule.due(620 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(700 * MS, 40.0, busy=False) is None  # silent: it would not hear the end
    assert schedule.due(760 * MS, 100.0, busy=True) is None  # the pause, but a partial is in flight ...
    assert schedule.due(780 * MS, 120.0, busy=False) == "pause"  # ... so right after it
    assert schedule.paused
    assert schedule.due(2000 * MS, 900.0, busy=False) is None  # one pause partial per pause
    assert schedule.due(2020 * MS, 0.0, busy=False) == "regular"  # spoke on: the schedule resumes
    assert not schedule.paused


def test_a_new_utterance_restarts_the_schedule() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=100)
    schedule.due(0, 150.0, busy=False)
    schedule.start_utterance(5000 * MS)
    assert not schedule.paused
    assert schedule.due(5200 * MS, 0.0, busy=False) is None
    assert schedule.due(5300 * MS, 0.0, busy=False) == "regular"


def test_no_pause_partial_when_a_reply_runs_on_a_partial_that_heard_every_word() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=100)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(460 * MS, 120.0, busy=False, heard=True) is None  # that partial stands in
    assert schedule.paused  # and it counts as the pause's: none later in this silence either
    assert schedule.due(900 * MS, 560.0, busy=False, heard=False) is None
    assert schedule.due(920 * MS, 0.0, busy=False) == "regular"  # spoke on


def test_a_late_pause_partial_hears_the_silence_after_the_words() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=32, late_pause_ms=128)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(420 * MS, 32.0, busy=False) == "pause"  # the first silent chunk
    assert schedule.paused
    assert schedule.due(440 * MS, 64.0, busy=False) is None
    assert schedule.due(500 * MS, 128.0, busy=True) is None  # the first is still decoding ...
    assert schedule.due(560 * MS, 160.0, busy=False) == "pause"  # ... the late one right after it
    assert schedule.due(900 * MS, 500.0, busy=False) is None  # two per pause, no more
    assert schedule.due(920 * MS, 0.0, busy=False) == "regular"  # spoke on
    assert schedule.due(960 * MS, 32.0, busy=False) == "pause"  # a new pause: both again


def test_a_late_partial_is_the_only_one_when_the_first_was_due_while_busy() -> None:
    """A partial that starts once the silence passed both stages counts for both: one decode, not two."""
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=32, late_pause_ms=128)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(360 * MS, 32.0, busy=True) is None
    assert schedule.due(520 * MS, 160.0, busy=False) == "pause"
    assert schedule.due(540 * MS, 192.0, busy=False) is None


def test_a_partial_that_heard_every_word_stands_in_for_the_first_pause_partial_only() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=32, late_pause_ms=128)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(420 * MS, 64.0, busy=False, heard=True) is None  # it stands in for the first
    assert schedule.paused
    assert schedule.due(480 * MS, 128.0, busy=False) == "pause"  # the late one hears the silence too


def test_the_late_pause_must_come_after_the_first() -> None:
    with pytest.raises(ValueError, match="late_pause_ms"):
        PartialSchedule(partial_every_ms=300, pause_ms=128, late_pause_ms=32)


def test_the_final_is_told_what_audio_holds_no_words() -> None:
    end, voiced = 900 * MS, 600 * MS  # the frame that confirmed the end; the last voiced frame's end
    assert final_trailing_ms(end, voiced) == 300.0
    # A partial that heard up to 560 ms stood in for the pause partial: everything after it, and the
    # recogniser's margin more, so that its last pass (that partial) is the final.
    assert final_trailing_ms(end, voiced, stood_in_ns=560 * MS) == 340.0 + 1000 * FINAL_MARGIN_S
    assert final_trailing_ms(end, voiced, stood_in_ns=800 * MS) == 300.0  # never less than the silence


def test_a_reply_on_the_first_pause_partial_does_not_stand_in_for_the_late_one() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=32, late_pause_ms=128)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(420 * MS, 32.0, busy=False) == "pause"
    # A reply now runs on that pause partial (it heard every word): the late one is still due.
    assert schedule.due(520 * MS, 128.0, busy=False, heard=True) == "pause"


def test_the_quiet_tail_starts_the_first_pause_partial_before_silero_hears_silence() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=32, late_pause_ms=128, pause_quiet_ms=32)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(340 * MS, 0.0, busy=False, quiet_ms=16.0) is None  # a closure's worth: not yet
    assert schedule.due(360 * MS, 0.0, busy=False, quiet_ms=32.0) == "pause"  # Silero still hears voice
    assert schedule.paused and schedule.silent(0.0, quiet_ms=64.0)
    assert schedule.due(420 * MS, 32.0, busy=False, quiet_ms=96.0) is None  # Silero's first: already done
    assert schedule.due(600 * MS, 0.0, busy=False, quiet_ms=272.0) is None  # no regular one while quiet
    assert schedule.due(620 * MS, 128.0, busy=False, quiet_ms=292.0) == "pause"  # the late one as before
    assert not schedule.silent(0.0, quiet_ms=0.0)  # loud again: the user spoke on
    assert schedule.due(940 * MS, 0.0, busy=False) == "regular"
    assert not schedule.paused


def test_without_pause_quiet_ms_the_quiet_tail_starts_nothing() -> None:
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=32, late_pause_ms=128)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert schedule.due(360 * MS, 0.0, busy=False, quiet_ms=96.0) is None
    assert not schedule.silent(0.0, quiet_ms=96.0)
    assert schedule.due(400 * MS, 32.0, busy=False, quiet_ms=128.0) == "pause"
    with pytest.raises(ValueError, match="pause_quiet_ms"):
        PartialSchedule(partial_every_ms=300, pause_ms=32, pause_quiet_ms=-1)


def test_pause_due_says_whether_a_pause_partial_waits_for_the_one_in_flight() -> None:
    """`pause_due` (the session stops a regular partial in flight that could not end the turn when it says
    so) is `due`'s answer for the pause, as if no partial were in flight, and changes nothing."""
    schedule = PartialSchedule(partial_every_ms=300, pause_ms=32, late_pause_ms=128, pause_quiet_ms=32)
    schedule.start_utterance(0)
    assert schedule.due(300 * MS, 0.0, busy=False) == "regular"
    assert not schedule.pause_due(0.0)  # speaking
    assert not schedule.pause_due(0.0, quiet_ms=20.0)  # quiet, not long enough
    assert schedule.pause_due(0.0, quiet_ms=40.0)  # the quiet tail reached pause_quiet_ms
    assert schedule.pause_due(40.0)  # Silero's silence reached pause_ms
    assert not schedule.pause_due(40.0, heard=True)  # a reply on a partial that heard all stands in
    assert schedule.due(360 * MS, 40.0, busy=True) is None and schedule.pause_due(40.0)  # nothing changed
    assert schedule.due(380 * MS, 60.0, busy=False) == "pause"
    assert not schedule.pause_due(60.0)  # started
    assert schedule.pause_due(140.0)  # the late one
    assert schedule.pause_due(140.0, heard=True)  # (no stand-in for the late one)
