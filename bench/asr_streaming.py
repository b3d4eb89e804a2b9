"""Streamed recognition quality: word error rate and sameness of the final under different partial schedules.

    .venv/bin/python -m bench.asr_streaming [--stable-after none,0,0.3] [--schedules 15:0,15:7,...]

Each question of bench/voice_questions.txt (and "What is the capital of France?", the browser test's) is
spoken by espeak-ng and streamed frame by frame through `StreamingRecognizer` (Whisper tiny.en, the default),
with a partial every EVERY frames starting at frame PHASE of the utterance (`--schedules EVERY:PHASE,...`; the
session asks for one every 300 ms = 15 frames, later when the CPU is busy), then the final after 200 ms of
silence. Per `AsrOptions.stable_after_s` value ("none": plain LocalAgreement-2) it reports the mean word
error rate of the finals, and for how many questions every schedule gave the same words (how far the
transcript depends on when the partial passes ran). For reference, one offline pass over each question.

Progress goes to stderr; the LAST line on stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from faster_whisper import WhisperModel

from tests.support.audio import espeak_speech
from voiceagent.asr import AsrOptions, StreamingRecognizer, WhisperDecoder, load_whisper
from voiceagent.audio import FRAME_SAMPLES, to_float
from voiceagent.wer import normalized_words, word_error_rate

QUESTIONS = Path("bench/voice_questions.txt")
EXTRA = ["What is the capital of France?"]
LEAD_FRAMES = 25  # 0.5 s of silence before the speech; the utterance starts 0.1 s before it (as a VAD would)
TRAIL_FRAMES = 10  # frames of silence pushed after the speech before the final (200 ms)


def streamed_final(
    model: WhisperModel, options: AsrOptions, speech: np.ndarray, every: int, phase: int
) -> str:
    """speech: [n] int16 16 kHz -> the final transcript with a partial every `every` frames from `phase`."""
    audio = np.concatenate([np.zeros(LEAD_FRAMES * FRAME_SAMPLES, np.int16), speech])
    audio = np.concatenate([audio, np.zeros((TRAIL_FRAMES + 1) * FRAME_SAMPLES, np.int16)])
    frames = audio[: audio.size // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)
    recognizer = StreamingRecognizer(model, options)
    start = LEAD_FRAMES - 5
    for frame in frames[:start]:
        recognizer.push(frame)
    recognizer.start()
    for i, frame in enumerate(frames[start:]):
        recognizer.push(frame)
        if i % every == phase and start + i < len(frames) - TRAIL_FRAMES:
            recognizer.decode_partial()
    return recognizer.decode_final(TRAIL_FRAMES * 20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stable-after", default="none,0,0.3", help="AsrOptions.stable_after_s values (s)")
    parser.add_argument("--schedules", default="15:0,15:7,20:3,25:11,12:5,8:0", help="EVERY:PHASE in frames")
    args = parser.parse_args(argv)
    values = [None if v == "none" else float(v) for v in args.stable_after.split(",")]
    schedules = [tuple(int(x) for x in s.split(":")) for s in args.schedules.split(",")]
    if any(len(s) != 2 or s[0] < 1 or not 0 <= s[1] < s[0] for s in schedules):
        parser.error("--schedules: EVERY:PHASE with EVERY >= 1 and 0 <= PHASE < EVERY, e.g. 15:0,15:7")
    questions = [q.strip() for q in QUESTIONS.read_text().splitlines() if q.strip()] + EXTRA
    model = load_whisper()
    with tempfile.TemporaryDirectory() as directory:
        speech = {q: espeak_speech(q, directory) for q in questions}
    decoder = WhisperDecoder(model, AsrOptions())
    offline = [word_error_rate(q, decoder.text(to_float(speech[q]), "")) for q in questions]
    results: dict[str, object] = {"questions": len(questions), "schedules": args.schedules,
                                  "offline_wer": round(float(np.mean(offline)), 3)}  # fmt: skip
    for value in values:
        options = AsrOptions(stable_after_s=value)
        wers, same = [], 0
        for n, question in enumerate(questions, 1):
            finals = [streamed_final(model, options, speech[question], e, p) for e, p in schedules]
            wers += [word_error_rate(question, f) for f in finals]
            same += len({tuple(normalized_words(f)) for f in finals}) == 1
            print(f"stable_after_s={value}: {n}/{len(questions)} {finals[0]!r}", file=sys.stderr, flush=True)
        results[f"stable_after_{value}"] = {
            "mean_wer": round(float(np.mean(wers)), 3),
            "same_words_under_every_schedule": f"{same}/{len(questions)}",
        }
        print(f"stable_after_s={value}: {results[f'stable_after_{value}']}", file=sys.stderr, flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
