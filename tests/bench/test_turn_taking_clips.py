"""The turn-taking bench's Piper clips: each pause spliced in after its part of the sentence, and a rendering
that leaves a piece between two pauses without speech drawn again, then refused (Piper's "red, | green, |
and blue." once lost "green," so: two cuts in one comma's pause, one pause of 2.2 s instead of two)."""

import numpy as np
import pytest

from bench.turn_taking import clips
from bench.turn_taking.clips import PieceWithoutSpeech, render, render_piper
from voiceagent.audio import SAMPLE_RATE

WORD_S, COMMA_S, SPACE_S = 0.25, 0.3, 0.05


def tone_speaker(silent_word: str = "") -> tuple[clips.Synthesize, list[str]]:
    """A stand-in for Piper: each word a 0.25 s tone, a comma's pause after it (a faint hiss, fainter from
    one pause to the next), `silent_word` not heard; and the texts it was asked for."""
    asked: list[str] = []

    def speak(text: str) -> np.ndarray:
        asked.append(text)
        pieces, rng = [], np.random.default_rng(0)
        for i, word in enumerate(text.split()):
            n = int(WORD_S * SAMPLE_RATE)
            loud = word.strip(",.") != silent_word
            t = np.arange(n) / SAMPLE_RATE
            pieces.append((8000 * np.sin(2 * np.pi * 220 * t) * loud).astype(np.int16))
            gap = int((COMMA_S if word.endswith(",") else SPACE_S) * SAMPLE_RATE)
            pieces.append((rng.normal(0.0, 40.0 / (i + 1), gap)).astype(np.int16))
        return np.concatenate(pieces)

    return speak, asked


def loud_runs(audio: np.ndarray) -> int:
    """How many separate stretches of tone `audio` holds (by 10 ms frames)."""
    frames = np.abs(audio[: len(audio) // 160 * 160].astype(np.int32)).reshape(-1, 160).max(axis=1)
    loud = (frames > clips.LOUD).astype(np.int8)
    return int(np.count_nonzero(np.diff(loud) == 1) + loud[0])


def test_each_pause_follows_its_part_of_the_sentence() -> None:
    speak, _ = tone_speaker()
    audio, pauses = render("red, | green, | and blue.", speak, [0.8, 0.9])
    assert [round(b - a, 2) for a, b in pauses] == [0.8, 0.9]
    edges = [0.0, *[x for pause in pauses for x in pause], len(audio) / SAMPLE_RATE]
    pieces = [audio[int(edges[i] * SAMPLE_RATE) : int(edges[i + 1] * SAMPLE_RATE)] for i in range(0, 6, 2)]
    assert [loud_runs(piece) for piece in pieces] == [1, 1, 2]  # "red," / "green," / "and blue."


def test_a_piece_without_speech_is_drawn_again_then_refused() -> None:
    speak, asked = tone_speaker(silent_word="green")
    with pytest.raises(PieceWithoutSpeech, match="holds no speech"):
        render_piper("red, | green, | and blue.", speak, [0.8, 0.9])
    assert asked.count("red, green, and blue.") == clips.RENDER_ATTEMPTS  # the whole sentence each draw
