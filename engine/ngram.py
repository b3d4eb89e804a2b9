"""Drafts that cost nothing: prompt lookup. The ids that followed the last occurrence of the
conversation's last n ids (n = 3, then 2, then 1) are proposed as the next ones.

Conversations repeat themselves (code quotes its own identifiers, an answer restates the question), and a
proposal taken from the context costs no forward at all, so even a modest acceptance pays where a model
draft cannot (a CPU whose verify of 2 ids costs 1.4 steps). The target verifies these drafts like any other;
when sampling, a proposal is a draft distribution with all its mass on the proposed id.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_NGRAM = 3
SEARCH_WINDOW = 1024  # ids looked back over (a voice session's context; longer prompts keep their tail)


def propose(tokens: Sequence[int], max_tokens: int) -> list[int]:
    """Up to `max_tokens` ids that followed the latest earlier occurrence of the longest suffix of
    `tokens` (of MAX_NGRAM ids down to one) that occurs before; [] when none does."""
    if max_tokens <= 0:
        return []
    window = list(tokens[-SEARCH_WINDOW:])
    for n in range(min(MAX_NGRAM, len(window) - 1), 0, -1):
        suffix = window[-n:]
        for start in range(len(window) - n - 1, -1, -1):  # the latest match first
            if window[start : start + n] == suffix:
                follow = window[start + n : start + n + max_tokens]
                if follow:
                    return follow
    return []
