"""bench/asr_session's reading of a session trace: each final's delay after its turn's endpoint decision."""

from __future__ import annotations

from bench.asr_session import finals_after_decision, percentile


def test_each_final_is_timed_from_its_own_turn_s_decision() -> None:
    records = [
        {"event": "vad.speech_end", "turn": 1, "t_ns": 1_000_000_000, "confirmed_ns": 1_300_000_000},
        {"event": "asr.final", "turn": 1, "t_ns": 1_303_000_000, "text": "Ask not"},
        {"event": "vad.speech_end", "turn": 2, "t_ns": 4_000_000_000, "confirmed_ns": 4_500_000_000},
        {"event": "asr.final", "turn": 2, "t_ns": 4_620_000_000, "text": "what your country"},
        {"event": "asr.final", "turn": 3, "t_ns": 5_000_000_000, "text": "typed", "typed": True},
    ]
    texts, delays = finals_after_decision(records)
    assert texts == ["Ask not", "what your country"]
    assert delays == [3.0, 120.0]
    assert percentile([3.0, 4.0, 500.0], 0.5) == 4.0 and percentile([3.0, 4.0, 500.0], 0.95) == 500.0
