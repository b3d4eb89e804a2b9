"""Text deltas: never taken back, stop strings cut (even across blocks), partial characters held."""

from collections.abc import Sequence

from engine.detokenize import TextStream
from tests.fakes import FakeTokenizer


class BytesTokenizer:
    """Each id is one byte of UTF-8, like byte-level BPE on characters outside ASCII."""

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


def test_deltas_concatenate_to_the_text() -> None:
    stream = TextStream(FakeTokenizer())
    deltas = [stream.push([5]), stream.push([6, 7]), stream.push([0])]
    assert deltas == [" w5", " w6 w7", ""]


def test_a_partial_utf8_character_is_held_back() -> None:
    stream = TextStream(BytesTokenizer())
    euro = "€".encode()
    assert stream.push([ord("a"), euro[0]]) == "a"
    assert stream.push([euro[1]]) == ""
    assert stream.push([euro[2], ord("b")]) == "€b"


def test_stop_string_across_blocks_is_cut_and_never_emitted() -> None:
    stream = TextStream(BytesTokenizer(), stop=["END"])
    assert stream.push(list(b"hello E")) == "hello "  # "E" might start "END"
    assert stream.push(list(b"N")) == ""
    assert stream.push(list(b"D and more")) == ""
    assert stream.stopped and stream.text == "hello "


def test_a_false_start_of_a_stop_string_is_released() -> None:
    stream = TextStream(BytesTokenizer(), stop=["END"])
    assert stream.push(list(b"AN E")) == "AN "
    assert stream.push(list(b"X")) == "EX"
    assert not stream.stopped


def test_final_push_flushes_the_held_tail() -> None:
    stream = TextStream(BytesTokenizer(), stop=["END"])
    assert stream.push(list(b"ok E")) == "ok "
    assert stream.push([], final=True) == "E"
