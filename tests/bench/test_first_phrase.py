"""bench.first_phrase counts the tokens a reply's first phrase waits for, with and without the space."""

from bench.first_phrase import first_phrase_tokens


def test_a_phrase_its_mark_ends_goes_out_a_token_before_the_space() -> None:
    assert first_phrase_tokens(["Hi", ",", " nice", " to", " meet", " you", "."]) == ("Hi,", 2, 3)


def test_a_phrase_the_word_limit_ends_waits_for_the_next_word_either_way() -> None:
    texts = ["The", " capital", " of", " France", " is", " Paris", "."]
    assert first_phrase_tokens(texts) == ("The capital of France", 5, 5)


def test_a_one_phrase_reply_is_out_at_its_mark_not_at_its_end() -> None:
    assert first_phrase_tokens(["Sure", "!", ""]) == ("Sure!", 2, 3)
