"""Which recogniser for an ASR model name (VOICEAGENT_ASR_MODEL): Whisper through faster-whisper
(voiceagent/asr.py) or Moonshine through onnxruntime (voiceagent/moonshine.py), both `RecognizerLike`."""

from __future__ import annotations

from voiceagent.asr import AsrOptions, StreamingRecognizer, load_whisper
from voiceagent.moonshine import MoonshineRecognizer, load_moonshine
from voiceagent.speech_models import DEFAULT_WHISPER
from voiceagent.stages import RecognizerLike

__all__ = ["MOONSHINE", "load_asr_model", "new_recognizer"]

MOONSHINE = "moonshine-base"  # the ASR model name of Moonshine base English (voiceagent/moonshine.py)


def load_asr_model(model: str = DEFAULT_WHISPER) -> object:
    """Loads (once per process) the model behind `new_recognizer(model)`: at start-up, not in a turn."""
    if model == MOONSHINE:
        return load_moonshine()
    return load_whisper(model)


def new_recognizer(model: str = DEFAULT_WHISPER) -> RecognizerLike:
    """A session's recogniser for an ASR model (VOICEAGENT_ASR_MODEL): "tiny.en", "base", a CTranslate2
    Whisper directory, or "moonshine-base". The model itself loads once per process."""
    if model == MOONSHINE:
        return MoonshineRecognizer()
    return StreamingRecognizer(options=AsrOptions(model=model))
