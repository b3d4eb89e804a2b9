"""Incremental detokenization with stop strings: committed token ids in, final text deltas out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Tokenizer(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class TextStream:
    """Turns committed token ids into text deltas that never need taking back.

    Decodes all generated ids each time (byte-level BPE may merge across token boundaries), holds back an
    incomplete UTF-8 character and any tail that could still become a stop string.
    """

    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._token_ids: list[int] = []
        self._emitted = 0  # characters already handed out
        self.text = ""  # all text handed out so far
        self.stopped = False

    def push(self, token_ids: Sequence[int], final: bool = False) -> str:
        """Add committed ids; returns the new text. After a stop string matched, `stopped` is True."""
        assert not self.stopped, "push after a stop string matched"
        self._token_ids.extend(token_ids)
        full = self._tokenizer.decode(self._token_ids, skip_special_tokens=True)
        end = len(full)
        stop_at = self._find_stop(full)
        if stop_at is not None:
            self.stopped = True
            end = stop_at
        elif not final:
            end -= self._holdback(full)
        if end <= self._emitted:
            return ""
        delta = full[self._emitted : end]
        self._emitted = end
        self.text += delta
        return delta

    def _find_stop(self, full: str) -> int | None:
        if not self._stop:
            return None
        longest = max(len(s) for s in self._stop)
        search_from = max(0, self._emitted - longest + 1)
        hits = [i for s in self._stop if (i := full.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _holdback(self, full: str) -> int:
        """Characters at the end that may still change: a partial UTF-8 sequence or a stop-string prefix."""
        held = len(full) - len(full.rstrip("\ufffd"))
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(full)), 0, -1):
                if full.endswith(stop[:n]):
                    held = max(held, n)
                    break
        return held
