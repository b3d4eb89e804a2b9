"""Where a Moonshine pass spends its time: onnxruntime's profiler over one encoder run and decoder steps.

    .venv/bin/python -m bench.moonshine_profile [--graphs ort|float] [--steps 20] [--threads 2]

Runs the encoder once on JFK's first 5 s (voiceagent/real_speech.py) and `--steps` greedy decoder steps
after it, both sessions profiled (`SessionOptions.enable_profiling`; the profiler's own cost makes every
node slower). Prints, per session, the time of each run and the node time per operator type, and for the
decoder what the weights' dequantisation chains (nodes named `*_merged_0_*`, see
voiceagent/moonshine_graph.py) and the embedding's transpose took. The LAST line on stdout is one JSON
object with the figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime

from voiceagent.audio import to_float
from voiceagent.moonshine import MODEL_NAME, START_TOKEN, MoonshineModel
from voiceagent.moonshine_graph import float_graphs, ort_graphs
from voiceagent.real_speech import load_clips
from voiceagent.speech_models import prepare_speech_model


@dataclass(frozen=True)
class NodeTime:
    name: str
    op: str
    us: int


@dataclass(frozen=True)
class Profile:
    """One session's profile: the time of each run, and of each node in them."""

    run_ms: list[float]
    nodes: list[NodeTime]

    @classmethod
    def read(cls, path: Path) -> Profile:
        events = json.loads(path.read_text())
        runs = [round(e["dur"] / 1000, 1) for e in events if e.get("name") == "model_run"]
        nodes = [
            NodeTime(e["name"], e["args"]["op_name"], e["dur"])
            for e in events
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
        ]
        return cls(runs, nodes)

    def op_ms(self) -> dict[str, float]:
        """Node time per operator type (an If's own entry spans its branch's nodes: left out)."""
        totals: collections.Counter[str] = collections.Counter()
        for node in self.nodes:
            if node.op != "If":
                totals[node.op] += node.us
        return {op: round(us / 1000, 1) for op, us in totals.most_common()}

    def named_ms(self, part: str) -> float:
        return round(sum(n.us for n in self.nodes if part in n.name) / 1000, 1)


def profiled_session(path: Path, threads: int, prefix: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", choices=("ort", "float"), default="ort")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    directory = prepare_speech_model(MODEL_NAME)
    graphs = ort_graphs(directory) if args.graphs == "ort" else float_graphs(directory)
    audio = to_float(next(c for c in load_clips(("jfk",), log=lambda _: None)).audio)[: 5 * 16000]
    with tempfile.TemporaryDirectory() as scratch:
        model = MoonshineModel(graphs, directory / "tokenizer.json")
        model.encoder = profiled_session(graphs.encoder, args.threads, Path(scratch) / "encoder")
        model.decoder = profiled_session(graphs.decoder, args.threads, Path(scratch) / "decoder")
        hidden, cache, token = model.encode(audio), model.empty_cache(), START_TOKEN
        for _ in range(args.steps):
            token = int(model.decode(hidden, cache, [token])[-1].argmax())
        encoder = Profile.read(Path(model.encoder.end_profiling()))
        decoder = Profile.read(Path(model.decoder.end_profiling()))
    steps = decoder.run_ms
    figures = {
        "graphs": args.graphs, "threads": args.threads,
        "encoder": {"run_ms": encoder.run_ms, "op_ms": encoder.op_ms()},
        "decoder": {"steps": len(steps), "first_step_ms": steps[0],
                    "later_step_ms_mean": round(float(np.mean(steps[1:])), 1), "op_ms": decoder.op_ms(),
                    "dequantize_chains_ms": decoder.named_ms("_merged_0_"),
                    "embedding_transpose_ms": decoder.named_ms("Transpose_2067")},
    }  # fmt: skip
    print("encoder", encoder.run_ms, list(encoder.op_ms().items())[:8])
    print("decoder", {k: v for k, v in figures["decoder"].items() if k != "op_ms"})  # type: ignore[union-attr]
    print("decoder", list(decoder.op_ms().items())[:10])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
