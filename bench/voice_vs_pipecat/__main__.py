"""Voice to voice, ours against Pipecat 1.14's default voice pipeline, on the same clips in the same run.

    .venv/bin/python -m bench.voice_vs_pipecat [--limit N] [--out bench/results/DATE-cpu-voice-vs-pipecat.md]

The clips are `voiceagent bench`'s: each question of bench/voice_questions.txt spoken by the Piper voice and
two espeak-ng voices in turn, after 1 s of silence, played at real-time pace in 20 ms frames. Ours
(ours.py): one loaded Pipeline, a fresh session per clip through `voiceagent.talk.talk`. Pipecat
(pipecat_side.py, pipecat_voice.py): its own virtualenv (bench/turn_taking/pipecat_env.py, made on first
use), Silero VAD + Smart Turn v3 + Whisper tiny.en (our model directory) + its OpenAI LLM service on
llama.cpp's server (llama_server.py: the same GGUF as our target, 2 threads, 127.0.0.1) + Piper (our voice).
The clips are interleaved: each clip runs through both systems before the next, the first one alternating,
so the machine's load hits both alike. One untimed warm-up clip goes through each first.

Every figure is in ms after the end of the user's speech in the audio itself (timeline.py), the same
instant for both. The table goes to stderr; the LAST line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.turn_taking.pipecat_env import REQUIREMENTS, pipecat_python
from bench.voice_vs_pipecat import report
from bench.voice_vs_pipecat.llama_server import LlamaServer, llama_server
from bench.voice_vs_pipecat.ours import OurSide
from bench.voice_vs_pipecat.pipecat_side import PipecatConfig, PipecatWorker, pipecat_run
from bench.voice_vs_pipecat.timeline import SYSTEMS, ClipRun, SystemRun, speech_end_s
from voiceagent.config import Settings

Log = Callable[[str], None]
WARM_UP = "Hello, can you hear me?"
SERVER_THREADS = 2

NOTES = [
    "How each system is timed (all in ms after the end of the speech in the audio: the end of its last "
    "sample above -40 dBFS, mapped to wall time by the push schedule, frame k at t0 + 20 ms * k):",
    "",
    "- Ours: the session's trace. turn_end = vad.speech_end's confirmed_ns (the endpointer's decision), "
    "transcript = asr.final, first_text = llm.first_block, tts_first_audio = tts.first_audio, voice_to_voice "
    "= out.first_audio (handed to the simulated transport, which plays it in real time). vad_speech_end is "
    "our VAD's own end of speech (what `voiceagent bench` times from): add its offset to compare with that "
    "bench's figures.",
    "- Pipecat: the frames' push times (an observer; the pipeline's clock is the monotonic clock). "
    "turn_end = UserStoppedSpeakingFrame (Smart Turn v3 said complete, or its 3 s timer ran out, and the "
    "transcript is in), transcript = the first TranscriptionFrame, first_text = the LLM service's first "
    "LLMTextFrame, tts_first_audio = Piper's first TTSAudioRawFrame, voice_to_voice = the first audio frame "
    "our output transport was asked to write (it plays it in real time). vad_stop = Silero's "
    "VADUserStoppedSpeakingFrame (its stop_secs 0.2 s after the last voiced frame).",
    "",
    "What differs, beyond the designs:",
    "",
    "- The LLM: ours runs the bundled target GGUF with its 0.5B draft (speculative, llama.cpp kernels in "
    "process), starting preemptively on the pause partial; Pipecat's runs the same target GGUF alone on "
    "llama-cpp-python's server (2 threads, greedy, max 120 tokens, the same system prompt), after the turn.",
    "- Speech recognition: Pipecat's Whisper service runs tiny.en from our directory, int8, one thread per "
    "core (OMP_NUM_THREADS for its CTranslate2), with faster-whisper's defaults (beam 5) on the VAD segment "
    "plus 0.5 s of silence; ours streams greedy partials with its default recogniser (`asr` above).",
    "- Piper: the same voice and piper-tts version; Pipecat's service opens the voice with onnxruntime's "
    "default threads (one per core), ours with two, as speech jobs the engine waits for "
    "(voiceagent/cpu_lane.py); Pipecat speaks per sentence (its default aggregator).",
    "- RTVI is off in Pipecat (no client); its metrics are off, as by default.",
]


def load_questions(path: Path, limit: int | None) -> list[str]:
    if not path.is_file():
        raise ValueError(f"{path} does not exist (one question per line)")
    questions = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return questions[:limit] if limit else questions


def pipecat_config(server: LlamaServer, output_rate: int) -> PipecatConfig:
    from voiceagent.session_options import SPEECH_SYSTEM_PROMPT, SessionOptions
    from voiceagent.speech_models import VOICE_NAME, checked_voice, whisper_model_dir

    return PipecatConfig(
        whisper_dir=str(whisper_model_dir("tiny.en")),
        voice_dir=str(checked_voice().model.parent),
        voice_name=VOICE_NAME,
        system_prompt=SPEECH_SYSTEM_PROMPT,
        max_tokens=SessionOptions().reply.max_tokens,
        output_rate=output_rate,
        llm_url=server.base_url,
        llm_model=server.model,
    )


class Comparison:
    """Both systems, loaded; `clip` runs one question through each, in the given order."""

    def __init__(self, ours: OurSide, pipecat: PipecatWorker, scratch: Path, piper: Any) -> None:
        self.ours, self.pipecat, self.scratch, self.piper = ours, pipecat, scratch, piper

    async def clip(self, index: int, question: str, voice: str, order: Sequence[str]) -> ClipRun:
        from voiceagent.audio import SAMPLE_RATE, write_wav
        from voiceagent.bench import speak_question

        audio = speak_question(question, voice, self.scratch, self.piper)
        wav = self.scratch / f"clip-{index:02d}.wav"
        write_wav(wav, audio, SAMPLE_RATE)
        clip = ClipRun(index, voice, question, round(speech_end_s(audio), 3), order[0])
        for system in order:
            clip.runs[system] = await self._run(system, audio, wav, question, clip.speech_end_s, index)
        return clip

    async def _run(
        self, system: str, audio: np.ndarray, wav: Path, question: str, end_s: float, index: int
    ) -> SystemRun:
        if system == "ours":
            return await self.ours.run(audio, question, end_s, self.scratch / f"trace-{index:02d}.jsonl")
        result = await asyncio.to_thread(self.pipecat.run, wav)
        return pipecat_run(result, question, end_s)


def _row(clip: ClipRun) -> str:
    cells = []
    for system in SYSTEMS:
        run = clip.runs[system]
        v2v = run.latency_ms.get("voice_to_voice")
        cells.append(f"{system} {'—' if v2v is None else f'{v2v:6.0f}'} ms wer={run.word_error_rate}")
    said = clip.runs["pipecat"].transcript
    return f"{clip.index:2d} {clip.voice:18} " + "  ".join(cells) + f"  {said!r}"


async def compare(questions: Sequence[str], settings: Settings, log: Log) -> list[ClipRun]:
    from engine.models import resolve_gguf
    from voiceagent.bench import VOICES
    from voiceagent.tts import load_synthesizer

    python = pipecat_python(log)
    gguf = resolve_gguf(settings.target)
    clips: list[ClipRun] = []
    with (
        tempfile.TemporaryDirectory(prefix="voice-vs-pipecat-") as scratch_dir,
        llama_server(gguf, SERVER_THREADS, log) as server,
    ):
        scratch = Path(scratch_dir)
        ours = await OurSide.load(settings, log)
        pipecat = PipecatWorker(python, pipecat_config(server, settings.output_rate), scratch, log)
        try:
            both = Comparison(ours, pipecat, scratch, load_synthesizer("piper"))
            log(f"warm-up (untimed): {WARM_UP!r} through both")
            await both.clip(-1, WARM_UP, "piper", SYSTEMS)
            for i, question in enumerate(questions):
                order = SYSTEMS if i % 2 == 0 else tuple(reversed(SYSTEMS))
                clips.append(await both.clip(i, question, VOICES[i % len(VOICES)], order))
                log(_row(clips[-1]))
        finally:
            pipecat.close()
    return clips


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.voice_vs_pipecat", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--questions", type=Path, default=Path("bench/voice_questions.txt"))
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument("--out", type=Path, default=None, help="the markdown page (default bench/results/)")
    args = parser.parse_args(argv)
    log: Log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    questions = load_questions(args.questions, args.limit)
    today = datetime.date.today().isoformat()
    out = args.out or Path(f"bench/results/{today}-cpu-voice-vs-pipecat.md")
    load_before = report.uptime()
    log(f"{len(questions)} questions, both systems, interleaved; load: {load_before}")
    settings = Settings()
    clips = asyncio.run(compare(questions, settings, log))
    meta = {
        "date": today,
        "command": shlex.join([".venv/bin/python", "-m", "bench.voice_vs_pipecat", *(argv or sys.argv[1:])]),
        "machine": report.machine(),
        "load_before": load_before,
        "load_after": report.uptime(),
        "order": "interleaved per clip, the first system alternating (ours first on even clips)",
        "pipecat_requirements": list(REQUIREMENTS),
        "ours_models": {
            "target": settings.target,
            "draft": settings.draft,
            "backend": settings.backend,
            "gamma": settings.gamma,
            "asr": settings.asr_model,
            "tts": settings.tts,
        },
    }
    summary = report.summarize(clips, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.markdown(summary, NOTES))
    for system in SYSTEMS:
        v2v = summary[system]["voice_to_voice"]
        log(f"{system:8} voice to voice p50 {v2v['p50']} ms  p95 {v2v['p95']} ms  (n {v2v['n']})")
    log(f"ratio ours / Pipecat: {summary['ratio_ours_over_pipecat']}; page: {out}")
    print(json.dumps(summary))
    return 0 if summary["ours"]["errors"] == 0 and summary["pipecat"]["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
