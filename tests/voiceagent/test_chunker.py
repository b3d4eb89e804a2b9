"""The phrase chunker speaks committed words only, whole, in order, early, and without markdown or code."""

import random

import pytest

from voiceagent.chunker import DEFAULT_CHUNKING, ChunkerOptions, PhraseChunker, _ends_word

REPLY = (
    "Sure! The capital of France is Paris, which has about 2.1 million people. Mr. Smith, e.g. my "
    "friend, lives there with his wife and their three children in a small flat near the river today."
)

MARKDOWN = """## Baking tips

1. **Preheat** the oven to `200` degrees.
- See [the guide](https://example.org/bake) for *more* detail.
> Note: keep the door __closed__.

```python
oven.preheat(200)  # never read aloud
```

---
That's all, enjoy!
| step | time |
|------|------|
"""

MARKDOWN_SPOKEN = (
    "Baking tips Preheat the oven to 200 degrees. See the guide for more detail. Note: keep the door "
    "closed. That's all, enjoy! step time"
)


def chunk(blocks: list[str], options: ChunkerOptions = DEFAULT_CHUNKING) -> list[str]:
    chunker = PhraseChunker(options)
    phrases = [phrase for block in blocks for phrase in chunker.push(block)]
    return phrases + chunker.flush()


def random_blocks(text: str, seed: int, n_cuts: int = 15) -> list[str]:
    """`text` cut at random characters: mid-word, mid-number, mid-markup, like token blocks."""
    cuts = sorted(random.Random(seed).sample(range(1, len(text)), n_cuts))
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_a_word_split_across_blocks_waits_for_its_end() -> None:
    chunker = PhraseChunker()
    assert chunker.push("Hel") == []
    assert chunker.push("lo there, my fri") == ["Hello there,"]
    assert chunker.push("end") == []  # "friend" may still go on ("friendly")
    assert chunker.push("ly neighbour. How a") == ["my friendly neighbour."]
    assert chunker.flush() == ["How a"]  # the reply ended: its last word is whole now


def test_a_word_its_mark_ends_is_spoken_without_waiting_for_the_next_block() -> None:
    """The first phrase goes out with the block that closed it, not one target step later."""
    chunker = PhraseChunker()
    assert chunker.push("Hi") == []
    assert chunker.push(",") == ["Hi,"]  # before " nice" arrives
    assert chunker.push(" nice to meet you") == []
    assert chunker.push(".") == ["nice to meet you."]
    for text in ["Sure!", "Really?", "Well;", "Paris."]:
        assert PhraseChunker().push(text) == [text]
    # what more text may extend still waits: decimals, thousands, abbreviations, initials, quotes, URLs
    for text in ["It's 3.", "About 1,", "Ask Mr.", "J.", 'Say "Gracias,', "See https:", "**Note**,"]:
        assert PhraseChunker().push(text) == [], text


@pytest.mark.parametrize("seed", range(30))
def test_only_committed_whole_words_are_spoken_in_order(seed: int) -> None:
    words = " ".join(REPLY.split()).split(" ")
    chunker = PhraseChunker()
    spoken: list[str] = []
    committed = ""
    for block in random_blocks(REPLY, seed):
        committed += block
        spoken += " ".join(chunker.push(block)).split()
        assert spoken == words[: len(spoken)]  # whole words, in order, nothing invented
        last_is_open = not committed[-1].isspace() and not _ends_word(committed.split()[-1])
        whole_words_committed = len(committed.split()) - last_is_open
        assert len(spoken) <= whole_words_committed  # never a word whose end has not arrived
    assert spoken + " ".join(chunker.flush()).split() == words


def test_phrases_do_not_depend_on_how_the_text_was_cut() -> None:
    whole = chunk([REPLY])
    assert " ".join(whole) == " ".join(REPLY.split())
    for seed in range(50):
        assert chunk(random_blocks(REPLY, seed)) == whole


def test_the_first_phrase_is_short_and_phrases_grow_to_max_words() -> None:
    text = " ".join(f"word{i}" for i in range(60))  # no punctuation at all
    lengths = [len(phrase.split()) for phrase in chunk([text], ChunkerOptions(4, 14, 3))]
    assert lengths == [4, 8, 14, 14, 14, 6]
    assert [len(p.split()) for p in chunk([text], ChunkerOptions(first_max_words=2, max_words=5))] == [
        2,
        4,
        *[5] * 10,
        4,
    ]


def test_phrases_end_at_sentences_and_at_clauses_of_min_words() -> None:
    assert chunk([REPLY]) == [
        "Sure!",
        "The capital of France is Paris,",
        "which has about 2.1 million people.",
        "Mr. Smith, e.g. my friend,",
        "lives there with his wife and their three children in a small flat near",
        "the river today.",
    ]
    # After the first phrase a clause mark needs min_words (3): "Well," stays with what follows.
    assert chunk(["Yes. Well, that is true; ok, fine? Great."]) == [
        "Yes.",
        "Well, that is true;",
        "ok, fine?",
        "Great.",
    ]
    assert chunk(["Hmm, well. It is"]) == ["Hmm,", "well.", "It is"]  # the first phrase: any mark


def test_decimals_abbreviations_and_initials_do_not_end_a_sentence() -> None:
    text = "Hi. It costs 3.5 dollars i.e. about 3.2 euros in the U.S. today. Ask Dr. J. Watson at 5 p.m. now."
    cut = ["Hi. It costs 3.", "5 dollars i.", "e. about 3", ".2 euros in the U.", "S. today. Ask Dr", ". J",
           ". Wat", "son at 5 p.m. now."]  # fmt: skip
    for blocks in ([text], cut):
        assert chunk(blocks, ChunkerOptions(first_max_words=20, max_words=20)) == [
            "Hi.",
            "It costs 3.5 dollars i.e. about 3.2 euros in the U.S. today.",
            "Ask Dr. J. Watson at 5 p.m. now.",
        ]


def test_line_breaks_end_phrases() -> None:
    assert chunk(["One two\nthree four five\n\nsix"]) == ["One two", "three four five", "six"]


@pytest.mark.parametrize("seed", range(20))
def test_markdown_is_stripped_and_code_blocks_are_never_spoken(seed: int) -> None:
    blocks = [MARKDOWN] if seed == 0 else random_blocks(MARKDOWN, seed, n_cuts=25)
    phrases = chunk(blocks)
    assert " ".join(phrases) == MARKDOWN_SPOKEN
    assert not any(mark in phrase for phrase in phrases for mark in "*`#[]()|>")


def test_markdown_phrases() -> None:
    assert chunk([MARKDOWN]) == [
        "Baking tips",
        "Preheat the oven to 200 degrees.",
        "See the guide for more detail.",
        "Note: keep the door closed.",
        "That's all, enjoy!",  # a clause of two words stays with what follows
        "step time",
    ]


def test_a_code_block_mid_reply_is_skipped_and_speech_resumes_after_it() -> None:
    text = "Run this:\n```bash\nrm -rf build\nmake test\n```\nThen check the output."
    assert chunk([text]) == ["Run this:", "Then check the output."]
    assert chunk(["Here:\n``", "`py\nx = 1\n``", "`\nDone."]) == ["Here:", "Done."]  # fences cut apart
    assert chunk(["Look:\n~~~\ncode\n~~~\nok"]) == ["Look:", "ok"]
    assert chunk(["Code:\n```\nprint(1)\n"]) == ["Code:"]  # a fence the reply never closed
    assert chunk(["Inline `x = 1` and snake_case or 2*3 stay."]) == [
        "Inline x = 1",
        "and snake_case or 2*3 stay.",
    ]


def test_a_line_of_numbers_alone_is_said_not_taken_for_a_list() -> None:
    # "What is two plus two?" -> "4." must be spoken; "1. Eggs" is a list item whose number is dropped
    def phrases(*blocks: str) -> list[str]:
        chunker = PhraseChunker()
        return [p for block in blocks for p in chunker.push(block)] + chunker.flush()

    assert phrases("4.") == ["4."]
    assert phrases("1.", " 2.") == ["1.", "2."]
    assert phrases("4.\n", "Four.") == ["4.", "Four."]
    assert phrases("1. Eggs\n", "2. Milk") == ["Eggs", "Milk"]


def test_flush_resets_the_chunker_for_the_next_reply() -> None:
    chunker = PhraseChunker()
    assert chunker.flush() == []
    assert chunker.push("```\ncode") == []
    assert chunker.flush() == []
    assert chunker.push("Hello again, ") == ["Hello again,"]  # a first phrase again, not inside a fence
    assert chunker.flush() == []


def test_blank_and_markup_only_text_says_nothing() -> None:
    assert chunk(["", "  \n\n", "**", "---\n", "* * *"]) == []


@pytest.mark.parametrize(
    "options",
    [{"first_max_words": 0}, {"max_words": 0}, {"min_words": 0}, {"min_words": 9, "max_words": 8}],
)
def test_bad_options_are_refused(options: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ChunkerOptions(**options)
