"""The phrase chunker: committed reply text in, phrases for TTS out.

Only committed text arrives here (the engine never takes a block back), and the chunker only ever speaks
words it was given: it holds a word until the whitespace after it has arrived (a block may end mid-word, or
mid-number: "3." may become "3.5"), unless its last mark already ends it (`_ends_word`: "Hi," "Sure!"
"Paris." with a letter before the mark), and cleanup only removes characters, never adds any. Waiting for
the whitespace there would cost the first phrase one more target step (38-110 ms on a 2-core CPU) for a
space that always comes.

A phrase ends at a sentence end (. ! ? and line breaks), at a clause mark (, ; : and dashes) once it has
`min_words` words, or after a word limit. The first phrase of a reply is cut sooner, at any mark or after
`first_max_words` words, because its length is what the user waits for before hearing anything; the limit
then doubles with each phrase up to `max_words`, so the next phrase is ready before the first is spoken.
"Mr.", "e.g.", initials and decimals do not end a sentence.

Markdown the model may emit is stripped: emphasis, inline code marks, headings, bullets, numbered-list
markers, block quotes, rules, table bars, and links and images become their text. Fenced code blocks are
dropped entirely: code is not something to read aloud.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_CHUNKING", "ChunkerOptions", "PhraseChunker", "clean_word"]


@dataclass(frozen=True)
class ChunkerOptions:
    """Where phrases end.

    `first_max_words` (4): the first phrase's longest length. Piper renders four words in ~60-150 ms on a
    2-core CPU, and they make ~1.2 s of speech: time for the model to commit the next phrase.
    `max_words` (14): the longest phrase. The limit doubles from `first_max_words` (4, 8, 14, 14, ...):
    while the first phrase plays, the model has time to commit only a few more words. Longer phrases sound
    more natural (one intonation contour each) but delay the next audio; Piper renders 14 words in
    ~0.2-0.4 s.
    `min_words` (3): a clause mark (, ; :) ends a later phrase only when it has this many words, so
    "Well," or "However," do not become phrases of their own. Sentence ends always end a phrase.
    """

    first_max_words: int = 4
    max_words: int = 14
    min_words: int = 3

    def __post_init__(self) -> None:
        if min(self.first_max_words, self.max_words, self.min_words) < 1:
            raise ValueError(f"chunker word counts must be >= 1, got {self}")
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) must not exceed max_words ({self.max_words})")


DEFAULT_CHUNKING = ChunkerOptions()

_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs approx dept est fig e.g i.e a.m p.m u.s u.k cf".split()
)
_CLOSERS = "\"')]}”’»"
_SENTENCE_END = ".!?…"
_CLAUSE_END = ",;:—–"
_FENCES = ("```", "~~~")
_LINE_MARKER = re.compile(r"#{1,6}|[-*+•>]|\d{1,3}[.)]")
_NUMBER_MARKER = re.compile(r"\d{1,3}[.)]")  # "1." starts a list item only if words follow on its line
_RULE = re.compile(r"(?:-{3,}|\*{3,}|_{3,}|={3,})")
_LINK_TARGET = re.compile(r"\]\([^)\s]*\)?")
_EMPHASIS = re.compile(r"(?<![A-Za-z0-9])[*_~]+|[*_~]+(?![A-Za-z0-9])")
_MARKUP_ONLY = re.compile(r"[*_~`#|>:\-\[\]()!]*")
_WHITESPACE = " \t\r\n\f\v"


def clean_word(word: str) -> str:
    """A word without markdown (emphasis, code marks, link targets, brackets); "" if nothing is left."""
    if _MARKUP_ONLY.fullmatch(word):
        return ""
    word = word.replace("`", "")
    word = _LINK_TARGET.sub("", word)  # "[text](url)" keeps "text"
    word = word.replace("![", "[").replace("[", "").replace("]", "")
    word = _EMPHASIS.sub("", word)  # "**bold**," -> "bold,"; "snake_case" and "2*3" stay
    return "" if _MARKUP_ONLY.fullmatch(word) else word


def _ends_sentence(word: str) -> bool:
    core = word.rstrip(_CLOSERS)
    if not core or core[-1] not in _SENTENCE_END:
        return False
    if core[-1] != ".":
        return True
    stem = core[:-1].lower()
    is_initial = len(stem) == 1 and stem.isalpha()  # "J. Smith"
    return stem not in _ABBREVIATIONS and not is_initial and not re.fullmatch(r"(?:[a-z]\.)+[a-z]", stem)


def _ends_word(token: str) -> bool:
    """A word no further text extends, though no whitespace follows yet: letters (and ' or -), then , ; !
    ? or a sentence's full stop ("Hi," "Sure!" "Paris." "That's,"). Not "3." "1," "Mr." "e.g." "http:",
    a link or a domain ("guide](https://example."), nor a quoted, bracketed or marked-up word, whose
    closer comes next ('"Gracias",' "**Note**,")."""
    core = token[:-1]
    if not core or not core[0].isalpha() or not all(c.isalpha() or c in "'’-" for c in core):
        return False
    return token[-1] in ",;!?" or (token[-1] == "." and _ends_sentence(token))


def _ends_clause(word: str) -> bool:
    core = word.rstrip(_CLOSERS)
    return bool(core) and core[-1] in _CLAUSE_END


class PhraseChunker:
    """Turns one reply's committed text into phrases; `push` each block's text, then `flush` at the end.

    After `flush` the chunker is empty and ready for another reply. The phrases joined with spaces are the
    reply's words after markdown cleanup, in order: nothing is invented, nothing uncommitted is spoken.
    """

    def __init__(self, options: ChunkerOptions = DEFAULT_CHUNKING) -> None:
        self.options = options
        self._reset()

    def _reset(self) -> None:
        self._buffer = ""  # text not yet consumed: a partial word, or a line start not yet decided
        self._at_line_start = True
        self._in_fence = False
        self._skip_line = False  # dropping the rest of a fence line
        self._held: list[str] = []  # "4." at a line's start: a list number if words follow, else said
        self._words: list[str] = []
        self._phrases: list[str] = []
        self._n_phrases = 0  # phrases of this reply so far (the first ones are shorter)

    def push(self, text: str) -> list[str]:
        """Adds a committed block's text; returns the phrases it completed (often none)."""
        self._buffer += text
        self._consume(final=False)
        return self._take()

    def flush(self) -> list[str]:
        """The reply is over: returns whatever is left as phrases and resets the chunker."""
        self._consume(final=True)
        self._say_held()
        self._end_phrase()
        phrases = self._take()
        self._reset()
        return phrases

    def _take(self) -> list[str]:
        phrases, self._phrases = self._phrases, []
        return phrases

    def _consume(self, final: bool) -> None:
        """Consumes every complete word (and, when `final`, the partial one at the end)."""
        while self._buffer:
            if self._skip_line:
                if not self._drop_rest_of_line():
                    return
                continue
            if self._buffer[0] in _WHITESPACE:
                self._whitespace(self._buffer[0])
                self._buffer = self._buffer[1:]
                continue
            end = next((i for i, c in enumerate(self._buffer) if c in _WHITESPACE), None)
            if end is None and not final and not _ends_word(self._buffer):
                return  # a word still being written: wait for the next block
            end = len(self._buffer) if end is None else end
            token, self._buffer = self._buffer[:end], self._buffer[end:]
            if self._at_line_start:
                self._line_start_token(token)
            else:
                self._add_word(token)

    def _drop_rest_of_line(self) -> bool:
        """Drops text up to the next line break; False when the line goes on past the buffer."""
        newline = self._buffer.find("\n")
        if newline < 0:
            self._buffer = ""
            return False
        self._buffer = self._buffer[newline + 1 :]
        self._skip_line = False
        self._at_line_start = True
        return True

    def _whitespace(self, char: str) -> None:
        if char == "\n":
            self._say_held()
            self._end_phrase()  # a line break ends a phrase (paragraphs, list items, headings)
            self._at_line_start = True

    def _line_start_token(self, token: str) -> None:
        """The first token of a line decides fences, and is dropped if it is a block marker."""
        if token.startswith(_FENCES):
            self._end_phrase()
            self._in_fence = not self._in_fence  # an opening or closing fence line
            self._skip_line = True
            return
        if self._in_fence:
            self._skip_line = True
            return
        if _NUMBER_MARKER.fullmatch(token):
            self._held.append(token)
            return
        if _LINE_MARKER.fullmatch(token) or _RULE.fullmatch(token):
            return  # "# ", "- ", "1. ", "> ": still at the line's start ("> - item")
        self._held = []  # they were list numbers
        self._at_line_start = False
        self._add_word(token)

    def _say_held(self) -> None:
        """The line ended on numbers alone ("4." answering "what is two plus two"): they are the words."""
        held, self._held = self._held, []
        for token in held:
            self._add_word(token)

    def _add_word(self, raw: str) -> None:
        word = clean_word(raw)
        if not word:
            return
        self._words.append(word)
        options, n = self.options, len(self._words)
        limit = min(options.max_words, options.first_max_words << min(self._n_phrases, 8))
        min_words = 1 if self._n_phrases == 0 else options.min_words
        if _ends_sentence(word) or (_ends_clause(word) and n >= min_words) or n >= limit:
            self._end_phrase()

    def _end_phrase(self) -> None:
        if self._words:
            self._phrases.append(" ".join(self._words))
            self._words = []
            self._n_phrases += 1
