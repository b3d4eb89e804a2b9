"""Word error rate: how far a transcript is from what was said (the bench and the tests score ASR with it)."""

from __future__ import annotations

import re


def normalized_words(text: str) -> list[str]:
    """Lower-case words without punctuation ("centre" spelled "center", as Whisper writes it)."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("centre", "center")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance over the reference's length, ignoring case and punctuation."""
    ref, hyp = normalized_words(reference), normalized_words(hypothesis)
    row = list(range(len(hyp) + 1))  # distances to each prefix of hyp, one reference word at a time
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[:], i
        for j, h in enumerate(hyp, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (r != h))
    return row[-1] / max(1, len(ref))
