"""Which recogniser for an ASR model name (VOICEAGENT_ASR_MODEL): Whisper through faster-whisper
(voiceagent/asr.py) or Moonshine through onnxruntime (voiceagent/moonshine.py), both `RecognizerLike`.

Moonshine hears words best, but it also hears words in a hum: over the agent's reply, "mm-hmm" came out as
"In a moment," or "Amend them," and "uh-huh" as "Ow," (bench/turn_taking, 4 of 10 backchannels taken for
real words, Whisper tiny.en 1 of 10, which writes hums as hums: "Mm-hmm", "Mm-mm"). So with Moonshine a
session's recogniser is a `SplitRecognizer`: speech that starts over the agent's reply (a possible barge-in,
voiceagent/barge_in.py) is heard by Whisper tiny.en, every other utterance by Moonshine.
"""

from __future__ import annotations

import numpy as np

from voiceagent.asr import AsrOptions, StreamingRecognizer, load_whisper
from voiceagent.moonshine import MoonshineRecognizer, load_moonshine
from voiceagent.speech_models import DEFAULT_WHISPER
from voiceagent.stages import BargeInRecognizer, RecognizerLike, StoppableRecognizer, TranscriptLike

__all__ = ["MOONSHINE", "BargeInRecognizer", "SplitRecognizer", "load_asr_model", "new_recognizer"]

MOONSHINE = "moonshine-base"  # the ASR model name of Moonshine base English (voiceagent/moonshine.py)
BARGE_IN_WHISPER = "tiny.en"  # hears speech over the agent's reply when Moonshine hears the turns


class SplitRecognizer:
    """`turns` hears the user's turns, `barge_ins` speech begun over the agent's reply (see the module
    docstring). Both hear every frame (so both have the pre-roll); each utterance is decoded by one."""

    def __init__(self, turns: RecognizerLike, barge_ins: RecognizerLike) -> None:
        self.turns, self.barge_ins = turns, barge_ins
        self.active = turns

    def start(self) -> None:
        self.active = self.turns
        self.turns.start()

    def start_barge_in(self) -> None:
        self.active = self.barge_ins
        self.barge_ins.start()

    def push(self, frame: np.ndarray) -> None:
        self.turns.push(frame)
        self.barge_ins.push(frame)

    def decode_partial(self) -> TranscriptLike:
        return self.active.decode_partial()

    def stop_partial(self) -> None:
        if isinstance(self.active, StoppableRecognizer):
            self.active.stop_partial()

    def decode_final(self, trailing_silence_ms: float = 0.0) -> str:
        return self.active.decode_final(trailing_silence_ms)


def load_asr_model(model: str = DEFAULT_WHISPER) -> object:
    """Loads (once per process) the model behind `new_recognizer(model)`: at start-up, not in a turn."""
    if model == MOONSHINE:
        load_whisper(BARGE_IN_WHISPER)  # for speech over the agent's reply
        return load_moonshine()
    return load_whisper(model)


def new_recognizer(model: str = DEFAULT_WHISPER) -> RecognizerLike:
    """A session's recogniser for an ASR model (VOICEAGENT_ASR_MODEL): "tiny.en", "base", a CTranslate2
    Whisper directory, or "moonshine-base". The model itself loads once per process."""
    if model == MOONSHINE:
        return SplitRecognizer(
            MoonshineRecognizer(), StreamingRecognizer(options=AsrOptions(model=BARGE_IN_WHISPER))
        )
    return StreamingRecognizer(options=AsrOptions(model=model))
