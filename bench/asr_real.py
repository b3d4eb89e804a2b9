"""Real recorded speech through the session's recogniser, streamed as live: the ASR model chosen on numbers.

    .venv/bin/python -m bench.asr_real [--models tiny.en,base,moonshine-base] [--paths wideband,phone]
                                       [--clips jfk,librivox-0870,...] [--out bench/results/FILE.md]

Each clip of voiceagent/real_speech.py (LibriVox, spoken cards, JFK, CMU ARCTIC; fetched by `voiceagent
models prepare`) is framed in 0.5 s of silence before and 1 s after, then pushed 20 ms at a time, on a
simulated clock that runs at the audio's pace, into Silero's `Endpointer` (voiceagent/vad.py, default
options: the fixed 320 ms end silence, the session's rule without end-of-turn scores) and a recogniser,
scheduled as voiceagent/session.py schedules them: `start()` at speech_start, partials on the session's
`PartialSchedule` (every 300 ms while the user speaks, none while one is running, two once they pause: at
32 and 128 ms of silence), and at speech_end `decode_final(trailing_ms)` with the session's `trailing_ms`.
Decodes run synchronously and take real time: the clock jumps by their wall time, as a worker thread would
keep the next partial (and the final) waiting. A clip the endpointer splits into several utterances is scored
on its finals joined in order (the count of utterances is reported).

Paths: "wideband" (16 kHz as recorded) and "phone" (the clip resampled to 8 kHz, mu-law encoded, decoded and
upsampled back to 16 kHz by the Twilio gateway's own `InboundAudio`, 20 ms chunks as Twilio sends them).

Per model and path: the word error rate of the finals over all clips (errors / reference words) and the mean
of the per-clip rates; time from the endpoint's decision (the frame that confirmed speech_end) to the final
transcript, p50/p95 over utterances, and of it how long the final waited for a partial still running and
how long its own call took (p50; ~0 when it reused a partial); CPU seconds (all threads) spent decoding per
second of audio. Models are run side by side, clip by clip, so that load from elsewhere falls on all alike.

Progress goes to stderr; the LAST line on stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.asr_real_report import machine, write_report
from voiceagent.audio import FRAME_MS, FRAME_SAMPLES, SAMPLE_RATE, mulaw_encode, resample
from voiceagent.gateway.inbound import InboundAudio
from voiceagent.partials import PartialSchedule
from voiceagent.real_speech import CLIPS, RealClip, load_clips
from voiceagent.session_options import SessionOptions
from voiceagent.stages import RecognizerLike
from voiceagent.vad import Endpointer, load_silero
from voiceagent.wer import normalized_words, word_error_rate

MODELS = ("tiny.en", "base", "moonshine-base")
LEAD_S, TRAIL_S = 0.5, 1.0
SCHEDULE = SessionOptions()  # the session's partial schedule (voiceagent/partials.py)
PARTIAL_EVERY_MS, PAUSE_MS, LATE_PAUSE_MS = (
    SCHEDULE.partial_every_ms,
    SCHEDULE.pause_ms,
    SCHEDULE.late_pause_ms,
)
FRAME_NS = FRAME_MS * 1_000_000


@dataclass
class ClipRun:
    """One clip through one model: the finals, and what they cost."""

    finals: list[str] = field(default_factory=list)
    final_latency_ms: list[float] = field(default_factory=list)  # per utterance
    final_wait_ms: list[float] = field(default_factory=list)  # of that: waiting for a partial in flight
    cpu_s: float = 0.0
    partials: int = 0


def phone_band(audio: np.ndarray) -> np.ndarray:
    """[n] int16 16 kHz -> the same after a phone line: 8 kHz mu-law in, as the Twilio gateway hears it."""
    codes = mulaw_encode(resample(audio, SAMPLE_RATE, SAMPLE_RATE // 2))
    inbound = InboundAudio(SAMPLE_RATE // 2)
    chunk = SAMPLE_RATE // 2 * FRAME_MS // 1000  # 160 bytes: one Twilio media message
    frames = [inbound.push_mulaw(codes[i : i + chunk], 0) for i in range(0, len(codes), chunk)]
    return np.concatenate([f.samples for chunk_frames in frames for f in chunk_frames])


def framed(audio: np.ndarray) -> np.ndarray:
    """The clip between silences, cut to whole frames: [frames, 320] int16."""
    lead, trail = (np.zeros(int(s * SAMPLE_RATE), np.int16) for s in (LEAD_S, TRAIL_S))
    padded = np.concatenate([lead, audio, trail])
    return padded[: padded.size // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)


class Timed:
    """Runs decodes, advancing the simulated clock by their wall time and summing their CPU time."""

    def __init__(self, run: ClipRun) -> None:
        self.run = run
        self.busy_until_ns = 0

    def __call__(self, now_ns: int, work: Callable[[], object]) -> tuple[int, object]:
        start_ns = max(now_ns, self.busy_until_ns)  # a decode in flight holds the next one back
        self.waited_ms = (start_ns - now_ns) / 1e6
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        self.run.cpu_s += time.process_time() - cpu
        self.busy_until_ns = start_ns + int((time.perf_counter() - wall) * 1e9)
        return self.busy_until_ns, result


def stream_clip(recognizer: RecognizerLike, audio: np.ndarray) -> ClipRun:
    """One clip streamed as live through a fresh Endpointer and `recognizer` (see the module docstring)."""
    run, endpointer = ClipRun(), Endpointer(model=load_silero())
    timed = Timed(run)
    schedule, speaking = PartialSchedule(PARTIAL_EVERY_MS, PAUSE_MS, LATE_PAUSE_MS), False
    for i, frame in enumerate(framed(audio)):
        t_ns = i * FRAME_NS  # the frame's start; it has arrived by its end
        now_ns = t_ns + FRAME_NS
        recognizer.push(frame)
        for edge in endpointer.push(frame, t_ns):
            if edge.kind == "speech_start":
                recognizer.start()
                speaking = True
                schedule.start_utterance(edge.confirmed_ns)
            else:
                speaking = False
                trailing_ms = (edge.confirmed_ns + FRAME_NS - edge.t_ns) / 1e6
                done_ns, text = timed(now_ns, lambda ms=trailing_ms: recognizer.decode_final(ms))
                run.finals.append(str(text).strip())
                run.final_latency_ms.append((done_ns - now_ns) / 1e6)
                run.final_wait_ms.append(timed.waited_ms)
        if not speaking:
            continue
        if schedule.due(t_ns, endpointer.silence_ms(), busy=timed.busy_until_ns > now_ns) is not None:
            timed(now_ns, recognizer.decode_partial)
            run.partials += 1
    return run


def new_recognizer(model: str) -> RecognizerLike:
    """The session's recogniser for `model` (loaded once per process)."""
    from voiceagent.recognizers import new_recognizer as make  # the one the pipeline uses

    return make(model)


def summarise(runs: list[tuple[RealClip, ClipRun]]) -> dict[str, object]:
    errors = sum(word_error_rate(c.text, " ".join(r.finals)) * len(normalized_words(c.text)) for c, r in runs)
    words = sum(len(normalized_words(c.text)) for c, _ in runs)
    latencies = [ms for _, r in runs for ms in r.final_latency_ms]
    waits = [ms for _, r in runs for ms in r.final_wait_ms]
    decoding = [t - w for _, r in runs for t, w in zip(r.final_latency_ms, r.final_wait_ms, strict=True)]
    seconds = sum(c.seconds for c, _ in runs)
    by_corpus: dict[str, list[float]] = {}
    for c, r in runs:
        by_corpus.setdefault(c.corpus, []).append(word_error_rate(c.text, " ".join(r.finals)))
    return {
        "wer": round(errors / max(1, words), 4),
        "mean_clip_wer": round(float(np.mean([w for v in by_corpus.values() for w in v])), 4),
        "wer_by_corpus": {k: round(float(np.mean(v)), 4) for k, v in by_corpus.items()},
        "final_ms_p50": round(float(np.percentile(latencies, 50)), 1) if latencies else None,
        "final_ms_p95": round(float(np.percentile(latencies, 95)), 1) if latencies else None,
        "final_wait_ms_p50": round(float(np.percentile(waits, 50)), 1) if waits else None,
        "finals_decoding_ms_p50": round(float(np.percentile(decoding, 50)), 1) if decoding else None,
        "cpu_s_per_audio_s": round(sum(r.cpu_s for _, r in runs) / seconds, 4),
        "utterances": len(latencies),
        "clips_split": sum(len(r.finals) > 1 for _, r in runs),
        "clips_without_final": sum(not any(r.finals) for _, r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--paths", default="wideband,phone")
    parser.add_argument("--clips", default=",".join(CLIPS))
    parser.add_argument("--repeat", type=int, default=1, help="stream every clip this many times")
    parser.add_argument("--out", type=Path, default=None, help="write the results page (markdown) here")
    args = parser.parse_args(argv)
    models, paths = args.models.split(","), args.paths.split(",")
    if set(paths) - {"wideband", "phone"}:
        parser.error("--paths: wideband and/or phone")
    clips = load_clips(tuple(args.clips.split(",")))
    audio = {(c.name, p): c.audio if p == "wideband" else phone_band(c.audio) for c in clips for p in paths}
    recognizers = {m: new_recognizer(m) for m in models}
    for recognizer in recognizers.values():  # warm: no clip pays a first call
        stream_clip(recognizer, clips[0].audio[: SAMPLE_RATE * 2])
    runs: dict[tuple[str, str], list[tuple[RealClip, ClipRun]]] = {(m, p): [] for m in models for p in paths}
    started = time.time()
    for n, clip in enumerate([c for c in clips for _ in range(args.repeat)], 1):
        for path in paths:
            for model in models:  # side by side: the same moment's load for every model
                run = stream_clip(recognizers[model], audio[(clip.name, path)])
                runs[(model, path)].append((clip, run))
                wer = word_error_rate(clip.text, " ".join(run.finals))
                ms = [round(x) for x in run.final_latency_ms]
                line = f"{n}/{len(clips) * args.repeat} {clip.name} {path} {model}: {wer:.2f} {run.finals}"
                print(f"{line} final {ms} ms", file=sys.stderr, flush=True)
    results = {f"{m}/{p}": summarise(r) for (m, p), r in runs.items()}
    summary = {"clips": len(clips), "repeat": args.repeat, "seconds": round(time.time() - started),
               "machine": machine(), "results": results}  # fmt: skip
    if args.out:
        write_report(args.out, " ".join(["python -m bench.asr_real", *(argv or sys.argv[1:])]), summary, runs)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
