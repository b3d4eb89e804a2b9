"""Smart Turn v3.2 (the end-of-turn audio model the session weighs beside the words' score): fed as
Pipecat feeds it (the last 8 s, silence before a shorter turn), it hears a finished sentence of real
recorded speech as complete and the same speech cut mid-sentence as not."""

import numpy as np
import pytest

from voiceagent.audio import SAMPLE_RATE, to_float
from voiceagent.real_speech import load_clips
from voiceagent.smart_turn import WINDOW_S, SmartTurn, last_window


def test_the_window_is_the_last_eight_seconds_with_silence_before_a_shorter_turn() -> None:
    short = np.ones(SAMPLE_RATE, dtype=np.float32)
    window = last_window(short)
    assert window.shape == (WINDOW_S * SAMPLE_RATE,)
    assert not window[:-SAMPLE_RATE].any() and window[-SAMPLE_RATE:].all()
    long = np.arange(10 * SAMPLE_RATE, dtype=np.float32)
    assert np.array_equal(last_window(long), long[-WINDOW_S * SAMPLE_RATE :])


@pytest.fixture(scope="module")
def smart_turn() -> SmartTurn:
    return SmartTurn()


@pytest.mark.parametrize("name", ["arctic-a0007", "arctic-a0009"])
def test_real_speech_sounds_complete_at_its_end_and_not_mid_sentence(
    smart_turn: SmartTurn, name: str
) -> None:
    clip = load_clips((name,), log=lambda _: None)[0]
    audio = to_float(clip.audio)
    whole = smart_turn.probability(audio)  # the sentence and the silence after it
    cut = smart_turn.probability(audio[: audio.size // 2])  # "And you always want to ..." (mid-word)
    assert whole > 0.7 and cut < 0.2, (whole, cut)


def test_no_audio_is_a_clear_error(smart_turn: SmartTurn) -> None:
    with pytest.raises(ValueError, match="needs some audio"):
        smart_turn.probability(np.zeros(0, dtype=np.float32))
