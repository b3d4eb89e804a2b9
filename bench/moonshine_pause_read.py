"""How Moonshine reads the words before a pause, by the quiet heard after them: the turn-taking clips' words
(a finished question whole; a paused sentence up to its first pause), each followed by T ms of the clip's
own silence, decoded greedily as a partial is (`MoonshineModel.transcribe`). The clips are bench/turn_taking's
(`python -m bench.turn_taking` renders them once). bench/results/2026-12-07-cpu-xeon-amx-167-pause-heard.md
has what a pause partial read with its quiet made up to 300 ms did to turn-taking (not kept).

    python -m bench.moonshine_pause_read [--quiet-ms 40,80,130,250,500,1000]

Per class and length: the mean word error rate against the words said (`voiceagent.wer`, which ignores case
and punctuation), and how many reads are exact
(a length past a clip's pause is left out for it: the read would hear the words after).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from bench.turn_taking.clips import TEXTS, Clip, build_clips
from engine.bench.cpu_backends import cpu_description
from voiceagent.audio import SAMPLE_RATE
from voiceagent.moonshine import load_moonshine
from voiceagent.speech_models import cache_root
from voiceagent.wer import word_error_rate

CLASSES = ("complete", "pause")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quiet-ms", default="40,80,130,250,500,1000", help="quiet after the words, ms")
    return parser.parse_args(argv)


def said_and_end(clip: Clip, text: str) -> tuple[str, np.ndarray, int, float]:
    """The words said before the clip's first pause (all of a finished question's; `text`, the clip's
    text with its "|" marks), its audio as float32, the sample where those words end, and how many ms of
    quiet follow them (a pause's 500-1000; the clip's trailing silence)."""
    audio = clip.audio().astype(np.float32) / 32768.0
    if clip.kind == "pause" and clip.pauses:
        start_s, end_s = clip.pauses[0]
        quiet_ms = 1000 * (end_s - start_s)
    else:
        start_s, quiet_ms = clip.speech_end_s, 1000 * (audio.size / SAMPLE_RATE - clip.speech_end_s)
    return text.split("|")[0], audio, int(start_s * SAMPLE_RATE), quiet_ms


def marked_text(clip: Clip) -> str:
    """The clip's text with its "|" pause marks (its name is kind-subset-index-voice)."""
    index = int(clip.name.split("-")[2])
    return TEXTS[clip.kind][clip.subset][index]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    lengths = [float(ms) for ms in args.quiet_ms.split(",")]
    clips = [c for c in build_clips(cache_root() / "turn-taking", log=print) if c.kind in CLASSES]
    model = load_moonshine()
    errors: dict[str, list[float]] = {}  # "class quiet" -> word error rates
    for n, clip in enumerate(clips, 1):
        said, audio, end, quiet_ms = said_and_end(clip, marked_text(clip))
        for ms in (ms for ms in lengths if ms <= quiet_ms):  # not into the words after the pause
            heard = model.transcribe(audio[: end + int(ms * SAMPLE_RATE / 1000)])
            errors.setdefault(f"{clip.kind} {ms:g}", []).append(word_error_rate(said, heard))
        print(f"[{n}/{len(clips)}] {clip.name}", file=sys.stderr, flush=True)
    summary = {
        key: {"mean_wer": round(statistics.mean(v), 3), "exact": sum(e == 0 for e in v), "n": len(v)}
        for key, v in errors.items()
    }
    for key, row in summary.items():
        print(f"{key:>22}: WER {row['mean_wer']:.3f}, exact {row['exact']} of {row['n']}")
    print(json.dumps({"cpu": cpu_description(), "reads": summary}))


if __name__ == "__main__":
    main()
