"""Why speech jobs and the engine take turns on a small CPU (voiceagent/cpu_lane.py): each alone, then beside
each other, in one run.

    .venv/bin/python -m bench.cpu_lane [--seconds 4]

Piper renders the first phrases of bench replies (each twice; the time to its first audio chunk) with 1 and
with 2 onnxruntime threads, alone; the default target (ggml, plain decoding, every core) decodes alone for
`--seconds` (median ms per token); then Piper renders again, with 1 and with 2 threads, while the engine
decodes, and the engine's tokens meanwhile are timed too. Progress goes to stderr; the LAST line on stdout
is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time

from voiceagent.tts import PiperSynthesizer

PHRASES = ("There are 29 days", "To boil an egg,", "Weather is the current", "The pharmacy usually opens")


def first_audio_ms(piper: PiperSynthesizer, text: str) -> float:
    started = time.perf_counter()
    for _ in piper.synthesize(text):
        return (time.perf_counter() - started) * 1000
    raise ValueError(f"no audio for {text!r}")


def renders_ms(piper: PiperSynthesizer) -> float:
    return statistics.median(first_audio_ms(piper, text) for text in PHRASES for _ in range(2))


class Decoding:
    """The default target decoding greedily on a thread of its own, every token's time noted."""

    def __init__(self) -> None:
        from engine import EngineOptions, SamplingParams, chat_prompt, load_engine
        from engine.bundled import DEFAULT_TARGET

        self.engine = load_engine(EngineOptions(target=DEFAULT_TARGET, backend="ggml"))
        self.prompt = chat_prompt(self.engine.tokenizer, [{"role": "user", "content": "Tell a long story."}])
        self.params = SamplingParams(0.0, 1.0, 0, 48)
        self.token_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conversation = self.engine.new_conversation()
        while not self._stop.is_set():
            started = time.perf_counter()
            for _ in conversation.generate(self.prompt, self.params):
                if self._stop.is_set():
                    return
                now = time.perf_counter()
                self.token_s.append(now - started)
                started = now

    def start(self) -> None:
        self._thread.start()

    def ms_per_token_from(self, first: int) -> float:
        return statistics.median(self.token_s[first:]) * 1000

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="of the engine decoding alone")
    args = parser.parse_args()
    pipers = {threads: PiperSynthesizer.load(threads=threads) for threads in (1, 2)}
    figures: dict[str, float] = {}
    for threads, piper in pipers.items():
        figures[f"piper_{threads}_threads_alone_ms"] = renders_ms(piper)
        print(
            f"Piper, {threads} thread(s), alone: {figures[f'piper_{threads}_threads_alone_ms']:.0f} ms",
            file=sys.stderr,
        )
    decoding = Decoding()
    decoding.start()
    time.sleep(2.0)  # past the prefill
    first = len(decoding.token_s)
    time.sleep(args.seconds)
    figures["engine_alone_ms_per_token"] = decoding.ms_per_token_from(first)
    print(f"engine alone: {figures['engine_alone_ms_per_token']:.0f} ms/token", file=sys.stderr)
    for threads, piper in pipers.items():
        first = len(decoding.token_s)
        figures[f"piper_{threads}_threads_beside_ms"] = renders_ms(piper)
        figures[f"engine_beside_piper_{threads}_ms_per_token"] = decoding.ms_per_token_from(first)
        piper_ms, engine_ms = (figures[f"piper_{threads}_threads_beside_ms"],
                               figures[f"engine_beside_piper_{threads}_ms_per_token"])  # fmt: skip
        print(f"Piper, {threads} thread(s), beside the engine: {piper_ms:.0f} ms; the engine meanwhile "
              f"{engine_ms:.0f} ms/token", file=sys.stderr)  # fmt: skip
    decoding.stop()
    machine = {"machine": platform.machine(), "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
    print(json.dumps({**figures, **machine}))


if __name__ == "__main__":
    main()
