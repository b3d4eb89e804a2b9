"""The text-only end-of-turn evaluation: which prefixes count as unfinished, and what its figures mean."""

import numpy as np

from bench.turn_taking.text_scores import clip_lines, summary, utterances


def test_every_prefix_up_to_a_pause_is_unfinished_and_the_whole_line_finished() -> None:
    assert utterances(["Call me at | five five | one two.", "", "Thanks."]) == [
        ("Call me at", False),
        ("Call me at five five", False),
        ("Call me at five five one two.", True),
        ("Thanks.", True),
    ]


def test_the_clip_sentences_hold_no_backchannels() -> None:
    lines = clip_lines()
    assert "What is the capital of France?" in lines and "Mm-hmm." not in lines


def test_a_summary_counts_finished_scores_against_the_unfinished_ones() -> None:
    scores = np.array([0.9, 0.45, 0.05, 0.001, 0.2])
    finished = np.array([True, True, True, False, False])
    figures = summary(scores, finished)
    assert figures["auc"] == round((1 + 1 + 0.5) / 3, 3)  # 0.05 beats 0.001, not 0.2
    assert figures["finished_at_complete_score"] == round(2 / 3, 3)  # 0.9 and 0.45 reach 0.4
    assert figures["finished_at_early_score"] == round(1 / 3, 3)
    assert figures["unfinished_waiting_1s"] == 0.5  # 0.001 waits 2 s, 0.2 far less
    assert figures["finished_above_all_unfinished"] == round(2 / 3, 3)
