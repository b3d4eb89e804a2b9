"""Repairs of a recogniser's words that no decoding option prevents: repetition loops and prompt echoes.

Both showed on real speech (voiceagent/real_speech.py, bench/asr_real.py):
- A short utterance in an encoder window padded with silence (Whisper tiny.en, 1-2 s of speech in 8 s) is
  often transcribed as a loop: "10 of clubs 10 of clubs 10 of clubs 10 of", "5 5 5 5 5 5". Whisper's own
  guard, the compression ratio, misses loops of short phrases (that one compresses 1.9x, under 2.4), and
  decoding again with the full 30 s window costs 4-10x a pass. `collapse_repeats` keeps one copy.
- A pass conditioned on the text before its window (the stable prefix) may begin by saying that text again:
  prefix "Tell me a joke." and pass "Tell me a joke about the sea" gave "Tell me a joke. Tell me a joke
  about the sea". `drop_echo` removes the words the pass repeated from the prefix's end.

- The same window with a short question at its start may end by starting the question again after its
  question mark: "Can you tell me how to boil an egg? Can you tell me how to" (espeak-ng, in the voice
  bench on an AVX2 EPYC, twice in 16 clips), which the final then repeats, and whose end-of-turn score the
  unfinished copy drags down (1.5 s of waiting). `collapse_repeats` drops such a restart: three or more
  words after a sentence's end mark that repeat that sentence's first words, at the very end.

A phrase of two or more words said twice in a row, or a word three times in a row, is so rare in real
speech ("thank you, thank you") and so common in decoding loops that a lost repeat is the cheaper mistake.
Works on any sequence of items with a `key` (the word without case or punctuation) and a `text` (the word
as written, for its punctuation).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["collapse_repeats", "drop_echo", "text_key", "words_of"]

T = TypeVar("T")
MAX_WORD_RUN = 2  # "five five" is speech; a third "five" in a row is taken as a loop


def text_key(word: str) -> str:
    """A word without case or punctuation: what repeats are compared on."""
    return re.sub(r"[^\w']+", "", word.lower())


def words_of(text: str) -> list[str]:
    """A transcript's words with their punctuation, each with one leading space (as Whisper writes them)."""
    return [" " + w for w in text.split()]


def _first_repeat(keys: Sequence[str]) -> tuple[int, int] | None:
    """(start, length) of the longest phrase of >= 2 words that is said again right after itself."""
    for n in range(len(keys) // 2, 1, -1):
        for i in range(len(keys) - 2 * n + 1):
            if list(keys[i : i + n]) == list(keys[i + n : i + 2 * n]):
                return i, n
    return None


def collapse_repeats(items: Sequence[T], key: Callable[[T], str], text: Callable[[T], str] = str) -> list[T]:
    """One copy of each phrase repeated back to back (the last copy, which may carry on: "Tell me X. Tell
    me X about" keeps "Tell me X about"), at most MAX_WORD_RUN of a word in a row, no unfinished copy
    of the phrase before it at the very end ("10 of clubs 10 of" -> "10 of clubs"), and no restart of the
    last sentence after its end mark ("Tell me X? Tell me" -> "Tell me X?")."""
    out, looped = list(items), False
    while (repeat := _first_repeat([key(x) for x in out])) is not None:
        start, n = repeat
        del out[start : start + n]
        looped = True
    run_kept: list[T] = []
    for x in out:
        if len(run_kept) >= MAX_WORD_RUN and all(key(y) == key(x) for y in run_kept[-MAX_WORD_RUN:]):
            continue
        run_kept.append(x)
    return _drop_restart(_drop_unfinished_copy(run_kept, key, looped), key, text)


def _drop_unfinished_copy(items: list[T], key: Callable[[T], str], looped: bool) -> list[T]:
    """Without a loop before, only a copy short of one word counts ("10 of clubs 10 of"): "the man saw the
    dog and the man" must stay."""
    keys = [key(x) for x in items]
    for n in range(3, len(keys) - 1):  # the phrase's length
        for k in range(n - 1, 1 if looped else n - 2, -1):  # the unfinished copy's length
            if len(keys) >= n + k and keys[-k:] == keys[-k - n : -k][:k]:
                return items[:-k]
    return items


MIN_RESTART_WORDS = 3  # "Can you? Can you" may be said; three words said again after the mark are a loop
SENTENCE_END = (".", "?", "!")


def _drop_restart(items: list[T], key: Callable[[T], str], text: Callable[[T], str]) -> list[T]:
    """Without the words after the last sentence end mark when they repeat the start of that sentence."""
    ends = [i for i, x in enumerate(items[:-1]) if text(x).rstrip().endswith(SENTENCE_END)]
    if not ends:
        return items
    last_end = ends[-1]
    start = ends[-2] + 1 if len(ends) > 1 else 0  # the sentence that the mark at last_end closes
    keys = [key(x) for x in items]
    tail, sentence = keys[last_end + 1 :], keys[start : last_end + 1]
    if MIN_RESTART_WORDS <= len(tail) < len(sentence) and sentence[: len(tail)] == tail:
        return items[: last_end + 1]
    return items


def drop_echo(prefix_keys: Sequence[str], items: Sequence[T], key: Callable[[T], str]) -> list[T]:
    """`items` without a head (>= 2 words) that repeats the end of the prefix (the text before them)."""
    keys = [key(x) for x in items]
    for k in range(min(len(prefix_keys), len(keys)), 1, -1):
        if list(prefix_keys[len(prefix_keys) - k :]) == keys[:k]:
            return list(items[k:])
    return list(items)
