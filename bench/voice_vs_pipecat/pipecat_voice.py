"""Pipecat 1.14's default voice pipeline on the bench's clips; run by the Pipecat virtualenv's Python.

    <pipecat venv>/bin/python bench/voice_vs_pipecat/pipecat_voice.py CONFIG.json

Imports only Pipecat, numpy and the standard library (this project is not installed in that virtualenv).
The pipeline is the one Pipecat's examples build: transport input -> WhisperSTTService -> user aggregator
(SileroVADAnalyzer, default turn strategies: Smart Turn v3 from the wheel) -> OpenAILLMService ->
PiperTTSService -> transport output -> assistant aggregator. The models are the parent's, named in CONFIG:
the Whisper directory, the Piper voice's folder and name, llama.cpp's URL. RTVI is off (no client).

The transport is ours: `ClipInput` is a microphone that plays a clip at real-time pace (20 ms frames), then
silence until the reply has been played; `PlaybackOutput` plays the bot's audio in real time and notes its
first frame. One pipeline serves every clip, as one loaded pipeline serves every session on our side; the
conversation is emptied before each clip (the system prompt is the LLM service's `system_instruction`).

Protocol: {"ready": true} once the pipeline runs, then one JSON request per stdin line ({"path": WAV}) and
one JSON result per line, on the original stdout (anything Pipecat prints goes to stderr): `t0_ns` (when the
clip's first frame was pushed) and each event's monotonic ns, from the frames' push times (the pipeline's
clock is the monotonic one).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import wave
from pathlib import Path

from loguru import logger
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.clocks.base_clock import BaseClock
from pipecat.frames.frames import (
    InputAudioRawFrame,
    LLMFullResponseEndFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    UserStoppedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.piper.tts import PiperTTSService
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.workers.runner import WorkerRunner

RATE = 16000
FRAME_BYTES = 640  # 20 ms of PCM16 mono
FRAME_NS = 20_000_000
NO_REPLY_S = 60.0  # after the clip: Smart Turn's 3 s, the 5 s stop timeout, the reply on a loaded CPU
LONGEST_S = 120.0  # after the clip's end, the most a clip may take (a reply on an overloaded CPU)
QUIET_S = 3.0  # no bot audio for this long after the LLM's end: the reply has been spoken


class MonotonicClock(BaseClock):
    """The pipeline's clock on absolute monotonic ns, so frame push times compare with `t0_ns`."""

    def get_time(self) -> int:
        return time.monotonic_ns()

    def start(self) -> None:
        pass


class Marks:
    """What happened during one clip: the first push time of each event, the transcript and the reply."""

    def __init__(self) -> None:
        self.times: dict[str, int] = {}
        self.vad_stops: list[int] = []
        self.transcript: list[str] = []
        self.reply: list[str] = []
        self.errors: list[str] = []
        self.done = asyncio.Event()  # the reply has been played (or the clip gave up waiting for one)
        self.reply_over = asyncio.Event()  # the LLM finished this turn's reply
        self.audio_seen = asyncio.Event()  # set at every bot audio frame: the reply is still being spoken

    def first(self, name: str, t_ns: int) -> None:
        self.times.setdefault(name, t_ns)

    def reply_event(self, name: str, t_ns: int) -> bool:
        """Notes a reply's event, only once this clip's turn has ended (a late reply to an earlier clip that
        timed out is not this clip's); -> whether it counted."""
        if "turn_end" not in self.times:
            return False
        self.first(name, t_ns)
        return True


class TimingObserver(BaseObserver):
    """Notes the turn's events as frames are pushed; changes nothing in the pipeline."""

    def __init__(self, llm: object, tts: object) -> None:
        super().__init__()
        self.llm, self.tts = llm, tts
        self.marks = Marks()
        self._seen: set[int] = set()  # broadcast and passed-on frames are pushed more than once

    async def on_push_frame(self, data: FramePushed) -> None:
        frame, t, marks = data.frame, data.timestamp, self.marks
        if frame.id in self._seen:
            return
        self._seen.add(frame.id)
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            marks.vad_stops.append(t)
        elif isinstance(frame, UserStoppedSpeakingFrame):
            marks.first("turn_end", t)
        elif isinstance(frame, TranscriptionFrame):
            marks.first("transcript", t)
            marks.transcript.append(frame.text.strip())
        elif isinstance(frame, LLMTextFrame) and data.source is self.llm:
            if marks.reply_event("first_text", t):
                marks.reply.append(frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame) and data.source is self.llm:
            if marks.reply_event("llm_end", t):
                marks.reply_over.set()
        elif isinstance(frame, TTSAudioRawFrame) and data.source is self.tts:
            if marks.reply_event("tts_first_audio", t):
                marks.audio_seen.set()


class ClipInput(BaseInputTransport):
    """A microphone that plays one clip at a time in real time, then silence until told to stop."""

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def play(self, pcm: bytes, done: asyncio.Event, longest_s: float) -> int:
        """Pushes `pcm` then silence, 20 ms a frame on a schedule, until `done` or `longest_s`; -> t0 ns."""
        silence = bytes(FRAME_BYTES)
        t0 = time.monotonic_ns()
        k = 0
        while not done.is_set() and k * FRAME_NS < longest_s * 1e9:
            chunk = pcm[k * FRAME_BYTES : (k + 1) * FRAME_BYTES].ljust(FRAME_BYTES, b"\0") or silence
            await self.push_audio_frame(InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1))
            k += 1
            await asyncio.sleep(max(0.0, (t0 + k * FRAME_NS - time.monotonic_ns()) / 1e9))
        return t0


class PlaybackOutput(BaseOutputTransport):
    """Plays the bot's audio in real time (as a device would) and notes when its first frame went out."""

    def __init__(self, params: TransportParams, observer: TimingObserver) -> None:
        super().__init__(params)
        self.observer = observer

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        marks = self.observer.marks
        if marks.reply_event("voice_to_voice", time.monotonic_ns()):
            marks.audio_seen.set()
        await asyncio.sleep(len(frame.audio) / 2 / frame.sample_rate)
        return True


class ClipTransport(BaseTransport):
    def __init__(self, params: TransportParams, observer: TimingObserver) -> None:
        super().__init__()
        self._input = ClipInput(params)
        self._output = PlaybackOutput(params, observer)

    def input(self) -> ClipInput:
        return self._input

    def output(self) -> PlaybackOutput:
        return self._output


def build(config: dict[str, object]) -> tuple[PipelineWorker, ClipTransport, TimingObserver, LLMContext]:
    output_rate = int(str(config["output_rate"]))
    stt = WhisperSTTService(
        device="cpu",
        compute_type="int8",
        settings=WhisperSTTService.Settings(model=str(config["whisper_dir"])),
    )
    llm = OpenAILLMService(
        api_key="local",
        base_url=str(config["llm_url"]),
        settings=OpenAILLMService.Settings(
            model=str(config["llm_model"]),
            system_instruction=str(config["system_prompt"]),
            temperature=0.0,
            max_tokens=int(str(config["max_tokens"])),
        ),
    )
    tts = PiperTTSService(
        download_dir=Path(str(config["voice_dir"])),
        settings=PiperTTSService.Settings(voice=str(config["voice_name"])),
    )
    observer = TimingObserver(llm, tts)
    params = TransportParams(audio_in_enabled=True, audio_out_enabled=True, audio_in_sample_rate=RATE)
    transport = ClipTransport(params, observer)
    context = LLMContext()
    user, assistant = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer())
    )
    pipeline = Pipeline([transport.input(), stt, user, llm, tts, transport.output(), assistant])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=output_rate),
        clock=MonotonicClock(),
        observers=[observer],
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    return worker, transport, observer, context


def read_pcm16(path: str) -> bytes:
    with wave.open(path, "rb") as wav:
        if wav.getframerate() != RATE or wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16 kHz mono PCM16")
        return wav.readframes(wav.getnframes())


async def run_clip(path: str, transport: ClipTransport, observer: TimingObserver) -> dict[str, object]:
    pcm = read_pcm16(path)
    marks = observer.marks = Marks()
    clip_s = len(pcm) / 2 / RATE
    watchers = [
        asyncio.create_task(_no_reply_after(clip_s + NO_REPLY_S, marks)),
        asyncio.create_task(_done_when_spoken(marks)),
    ]
    t0 = await transport.input().play(pcm, marks.done, clip_s + LONGEST_S)
    for watcher in watchers:
        watcher.cancel()
    if "voice_to_voice" not in marks.times:
        marks.errors.append(f"no bot audio within {NO_REPLY_S:.0f} s of the clip's end")
    if "turn_end" in marks.times and not marks.transcript:
        marks.errors.append("the turn ended without a transcript: Pipecat leaves it unanswered")
    if "first_text" in marks.times and not marks.reply_over.is_set():  # the next clip must not hear it
        marks.errors.append(f"the reply was still being written {LONGEST_S:.0f} s after the clip: cut")
        await transport.input().broadcast_interruption()
        await asyncio.sleep(QUIET_S)
    return {
        "t0_ns": t0,
        "times_ns": marks.times,
        "vad_stops_ns": marks.vad_stops,
        "transcript": " ".join(filter(None, marks.transcript)),
        "reply": "".join(marks.reply).strip(),
        "errors": marks.errors,
    }


async def _done_when_spoken(marks: Marks) -> None:
    """Done once the LLM has finished and no bot audio has come for QUIET_S (Pipecat's own bot-stopped
    frame comes between sentences too, while the LLM is still writing the next)."""
    await marks.reply_over.wait()
    while True:
        marks.audio_seen.clear()
        try:
            await asyncio.wait_for(marks.audio_seen.wait(), QUIET_S)
        except TimeoutError:
            break
    marks.done.set()


async def _no_reply_after(seconds: float, marks: Marks) -> None:
    await asyncio.sleep(seconds)
    if "voice_to_voice" not in marks.times:
        marks.done.set()


async def serve(config: dict[str, object], results: object) -> None:
    worker, transport, observer, context = build(config)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: StartFrame) -> None:
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), timeout=120)
    print(json.dumps({"ready": True}), file=results, flush=True)  # type: ignore[call-overload]
    while line := await asyncio.to_thread(sys.stdin.readline):
        request = json.loads(line)
        context.set_messages([])  # a new conversation, as each clip is a new session on our side
        result = await run_clip(str(request["path"]), transport, observer)
        print(json.dumps(result), file=results, flush=True)  # type: ignore[call-overload]
    await worker.cancel()
    await running


def main() -> int:
    config = json.loads(open(sys.argv[1]).read())
    results = os.fdopen(os.dup(1), "w")  # the protocol; Pipecat's own prints go to stderr
    os.dup2(2, 1)
    logger.remove()
    logger.add(sys.stderr, level=os.environ.get("PIPECAT_LOG_LEVEL", "WARNING"))
    asyncio.run(serve(config, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
