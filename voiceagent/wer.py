"""Word error rate: how far a transcript is from what was said (the bench and the tests score ASR with it).

Both sides are normalised first, so that writing conventions are not counted as errors: case, punctuation
and hyphens ("ill-disposed" is "ill disposed"), the titles Whisper abbreviates ("Mr." is "mister", as
transcribers of read speech write it), British and American spellings Whisper swaps ("centre"), and numbers
written as digits ("10 of clubs" is "ten of clubs", "1961" is "nineteen sixty one").
"""

from __future__ import annotations

import re

_SPELLINGS = {"centre": "center", "mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}
_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> list[str]:
    """0..9999 as spoken: 21 -> twenty one, 305 -> three hundred five, 1961 -> nineteen sixty one."""
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10]] + (number_words(n % 10) if n % 10 else [])
    if n < 1000:
        return [_ONES[n // 100], "hundred"] + (number_words(n % 100) if n % 100 else [])
    if 1100 <= n < 10000 and n % 100 and n // 100 % 10:  # a year or a phone-style pair: "nineteen sixty one"
        return number_words(n // 100) + number_words(n % 100)
    return number_words(n // 1000) + ["thousand"] + (number_words(n % 1000) if n % 1000 else [])


def normalized_words(text: str) -> list[str]:
    """Lower-case words without punctuation, titles spelled out, numbers under 10,000 as words."""
    words: list[str] = []
    for word in re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace(",000", "000")).split():
        word = _SPELLINGS.get(word, word)
        words += number_words(int(word)) if word.isdigit() and int(word) < 10000 else [word]
    return words


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance over the reference's length, ignoring case and punctuation."""
    ref, hyp = normalized_words(reference), normalized_words(hypothesis)
    row = list(range(len(hyp) + 1))  # distances to each prefix of hyp, one reference word at a time
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[:], i
        for j, h in enumerate(hyp, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (r != h))
    return row[-1] / max(1, len(ref))
