"""Moonshine base on its shipped `.ort` graphs (the reference), on the rebuilt float graphs, and on those with
the int8 decoder (voiceagent/moonshine_graph.py), side by side, with Whisper tiny.en on the same clips in the
same run.

    .venv/bin/python -m bench.moonshine_speed [--steps 20] [--repeat 3]

Per Moonshine path: the time of one decoder step (median and p90 over `--steps` steps after the first, on
the encoding of JFK's first 5 s, `--repeat` times), the encoder's time for 2, 5 and 10 s of audio (median of
`--repeat`), and one whole `transcribe` of each of the 13 real clips (voiceagent/real_speech.py), timed, its
text, and its word error rate (voiceagent/wer.py; errors over all reference words). Whisper tiny.en
(voiceagent/asr.py `load_whisper`) hears each clip in one `StreamingRecognizer` pass (`decode_final` with no
partial before it). The three run clip by clip, interleaved, so that load from elsewhere falls on all alike;
each is warmed up on one clip first. Last, the float and int8 decoders with a draft: each clip once more,
its draft the tokens of a pass over all but its last 0.3 s (as the recogniser's final reuses its last
partial's tokens). With `--partials-every-s S` (a minute more at 0.6), partials every S s over each clip on
both, each decoded plainly and drafted with the previous drafted partial's tokens: time, and tokens the
same.
Progress goes to stderr; the LAST line on stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from voiceagent.asr import StreamingRecognizer, load_whisper
from voiceagent.audio import frames, to_float
from voiceagent.moonshine import MODEL_NAME, START_TOKEN, DecoderKind, MoonshineModel
from voiceagent.moonshine_graph import MoonshineGraphs, float_graphs, ort_graphs
from voiceagent.real_speech import RealClip, load_clips
from voiceagent.speech_models import prepare_speech_model
from voiceagent.wer import normalized_words, word_error_rate

Transcribe = Callable[[RealClip], str]
DRAFT_BEHIND_S = 0.3


@dataclass(frozen=True)
class ClipRun:
    clip: str
    seconds: float
    ms: float
    wer: float
    text: str


def cpu_facts() -> dict[str, object]:
    lines = open("/proc/cpuinfo").read().splitlines() if os.path.exists("/proc/cpuinfo") else []
    fields = dict(line.split(":", 1) for line in reversed(lines) if ":" in line)  # the first CPU's
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    return {"cpu": fields.get("model name") or platform.processor(), "cores": os.cpu_count(),
            "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "load_average": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip


def step_times_ms(model: MoonshineModel, hidden: np.ndarray, steps: int) -> list[float]:
    """Wall time of each decoder step after the first (the first computes the cross-attention cache)."""
    cache, token, times = model.empty_cache(), START_TOKEN, []
    model.decode(hidden, cache, [token])
    for _ in range(steps):
        start = time.perf_counter()
        token = int(model.decode(hidden, cache, [token])[-1].argmax())
        times.append((time.perf_counter() - start) * 1000)
    return times


def encoder_ms(model: MoonshineModel, audio: np.ndarray) -> float:
    start = time.perf_counter()
    model.encode(audio)
    return (time.perf_counter() - start) * 1000


def model_figures(
    models: dict[str, MoonshineModel], jfk: np.ndarray, args: argparse.Namespace
) -> dict[str, dict[str, object]]:
    """Decoder step and encoder times per model, the models taking turns `args.repeat` times."""
    steps: dict[str, list[float]] = {name: [] for name in models}
    encoder: dict[str, dict[int, list[float]]] = {name: {2: [], 5: [], 10: []} for name in models}
    for _ in range(args.repeat):
        for name, model in models.items():
            steps[name] += step_times_ms(model, model.encode(jfk[: 5 * 16000]), args.steps)
            for seconds, times in encoder[name].items():
                times.append(encoder_ms(model, jfk[: seconds * 16000]))
    return {
        name: {"encoder_ms": {f"{s}s": round(float(np.median(t)), 1) for s, t in encoder[name].items()},
               "step_ms_p50": round(float(np.median(steps[name])), 2),
               "step_ms_p90": round(float(np.percentile(steps[name], 90)), 2)}
        for name in models
    }  # fmt: skip


def drafted_partials(model: MoonshineModel, clips: list[RealClip], every_s: float) -> dict[str, object]:
    """Partials every `every_s` over each clip, each decoded plainly and with the last drafted partial's
    tokens as draft (as the recogniser runs them): both passes' time, and how many gave the same tokens."""
    plain_s = drafted_s = 0.0
    same = total = 0
    for clip in clips:
        audio, step = to_float(clip.audio), int(every_s * 16000)
        draft: list[int] = []
        for end in range(step, audio.size + step, step):
            start = time.perf_counter()
            plain = model.heard_tokens(audio[:end])
            middle = time.perf_counter()
            draft = model.heard_tokens(audio[:end], draft)
            plain_s, drafted_s = plain_s + middle - start, drafted_s + time.perf_counter() - middle
            same, total = same + (plain == draft), total + 1
    return {"every_s": every_s, "partials": total, "same_tokens": same,
            "plain_s": round(plain_s, 2), "drafted_s": round(drafted_s, 2)}  # fmt: skip


def moonshine_pass(model: MoonshineModel) -> Transcribe:
    return lambda clip: model.transcribe(to_float(clip.audio))


def drafted_runs(model: MoonshineModel, clips: list[RealClip], plain: list[ClipRun]) -> dict[str, object]:
    """Each clip decoded with, as its draft, the tokens of a pass over all but its last 0.3 s (what the
    partial before a final heard): the time of that pass alone, and whether its tokens are those of a pass
    without a draft (`plain` holds those passes' texts)."""
    times, same = [], 0
    for clip, reference in zip(clips, plain, strict=True):
        audio = to_float(clip.audio)
        draft = model.heard_tokens(audio[: -int(DRAFT_BEHIND_S * 16000)])
        start = time.perf_counter()
        tokens = model.heard_tokens(audio, draft)
        times.append((time.perf_counter() - start) * 1000)
        same += tokens == model.heard_tokens(audio) and model.text_of(tokens) == reference.text
    audio_s = sum(c.seconds for c in clips)
    return {"total_ms": round(sum(times), 1), "ms_per_audio_s": round(sum(times) / audio_s, 1),
            "same_tokens": f"{same}/{len(clips)}", "ms": [round(t, 1) for t in times]}  # fmt: skip


def whisper_pass(recognizer: StreamingRecognizer) -> Transcribe:
    def transcribe(clip: RealClip) -> str:
        recognizer.start(0.0)
        for frame in frames(clip.audio):
            recognizer.push(frame)
        return recognizer.decode_final()

    return transcribe


def same_texts(reference: list[ClipRun], runs: list[ClipRun]) -> str:
    return f"{sum(a.text == b.text for a, b in zip(reference, runs, strict=True))}/{len(runs)}"


def clip_runs(paths: dict[str, Transcribe], clips: list[RealClip]) -> dict[str, list[ClipRun]]:
    runs: dict[str, list[ClipRun]] = {name: [] for name in paths}
    for clip in clips:
        for name, transcribe in paths.items():
            start = time.perf_counter()
            text = transcribe(clip)
            ms = (time.perf_counter() - start) * 1000
            wer = word_error_rate(clip.text, text)
            runs[name].append(ClipRun(clip.name, round(clip.seconds, 2), round(ms, 1), round(wer, 4), text))
            print(f"{clip.name} {name}: {ms:.0f} ms, WER {wer:.3f}: {text}", file=sys.stderr)
    return runs


def summary(runs: list[ClipRun], clips: list[RealClip]) -> dict[str, float]:
    words = [len(normalized_words(c.text)) for c in clips]
    errors = sum(r.wer * n for r, n in zip(runs, words, strict=True))
    total_ms = sum(r.ms for r in runs)
    audio_s = sum(c.seconds for c in clips)
    return {"wer": round(errors / sum(words), 4), "total_ms": round(total_ms, 1),
            "ms_per_audio_s": round(total_ms / audio_s, 1), "audio_s": round(audio_s, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partials-every-s", type=float, default=0.0, help="also time drafted partials")
    args = parser.parse_args()
    directory = prepare_speech_model(MODEL_NAME)
    loaded: dict[str, MoonshineModel] = {}
    load_s: dict[str, float] = {}
    rebuilt = float_graphs(directory)  # checked by sha256 once
    paths_and_decoders: tuple[tuple[str, MoonshineGraphs, DecoderKind], ...] = (
        ("moonshine-ort", ort_graphs(directory), "float"),
        ("moonshine-float", rebuilt, "float"),
        ("moonshine-int8", rebuilt, "int8"),
    )
    for name, graphs, decoder in paths_and_decoders:
        start = time.perf_counter()
        loaded[name] = MoonshineModel(graphs, directory / "tokenizer.json", decoder=decoder)
        load_s[name] = round(time.perf_counter() - start, 2)
    clips = load_clips(log=lambda _: None)
    jfk = to_float(next(c for c in clips if c.name == "jfk").audio)
    paths = {name: moonshine_pass(model) for name, model in loaded.items()}
    paths["whisper-tiny.en"] = whisper_pass(StreamingRecognizer(load_whisper("tiny.en")))
    for transcribe in paths.values():
        transcribe(clips[0])  # warm-up
    figures = model_figures(loaded, jfk, args)
    for name, seconds in load_s.items():
        figures[name]["load_s"] = seconds
        print(f"{name}: {figures[name]}", file=sys.stderr)
    runs = clip_runs(paths, clips)
    for name, model_runs in runs.items():
        figures.setdefault(name, {}).update(summary(model_runs, clips))
    for name in ("moonshine-float", "moonshine-int8"):
        figures[f"{name}+draft"] = drafted_runs(loaded[name], clips, runs[name])
        if args.partials_every_s > 0:
            figures[f"{name} partials"] = drafted_partials(loaded[name], clips, args.partials_every_s)
    same = {
        f"{name} as moonshine-ort": same_texts(runs["moonshine-ort"], runs[name])
        for name in ("moonshine-float", "moonshine-int8")
    }
    result = {"machine": cpu_facts(), "figures": figures, "same_transcripts": same}
    print(json.dumps({**result, "runs": {name: [asdict(r) for r in rs] for name, rs in runs.items()}}))


if __name__ == "__main__":
    main()
