"""The partial schedule: regular partials while the user speaks, one at the pause, none in the silence."""

from __future__ import annotations

from voiceagent.partials import PartialSchedule

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
