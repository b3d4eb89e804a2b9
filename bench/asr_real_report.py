"""The results page of bench/asr_real.py: the command, the machine, a table per path, and every final."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import date
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """The CPU as lscpu names it, its widest vector extension, torch's kernel choice, the load average."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        lscpu = ""
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        capability = "unknown"
    return {
        "cpu": fields.get("Model name", platform.processor()).strip(),
        "cores": os.cpu_count(),
        "avx512": "avx512f" in flags,
        "avx2": "avx2" in flags,
        "torch_cpu_capability": capability,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _table(results: dict[str, dict[str, Any]], path: str) -> list[str]:
    rows = [
        "| model | WER (all words) | mean clip WER | LibriVox | cards | JFK | ARCTIC | final after endpoint "
        "p50 / p95 (ms) | of which waiting for a partial / the final's call, p50 (ms) | CPU s per audio s | "
        "utterances (clips split) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        model, on = key.split("/")
        if on != path:
            continue
        corpus = r["wer_by_corpus"]
        rows.append(
            f"| {model} | {r['wer']:.3f} | {r['mean_clip_wer']:.3f} | {corpus.get('librivox', 0):.3f} | "
            f"{corpus.get('cards', 0):.3f} | {corpus.get('jfk', 0):.3f} | {corpus.get('arctic', 0):.3f} | "
            f"{r['final_ms_p50']} / {r['final_ms_p95']} | {r['final_wait_ms_p50']} / "
            f"{r['finals_decoding_ms_p50']} | {r['cpu_s_per_audio_s']:.3f} | "
            f"{r['utterances']} ({r['clips_split']}) |"
        )
    return rows


def write_report(out: Path, command: str, summary: dict[str, Any], runs: dict[tuple[str, str], list]) -> None:
    """Writes the markdown page: figures first, then each clip's finals per model and path."""
    m = summary["machine"]
    lines = [
        f"# Real speech through the streaming recognisers ({date.today().isoformat()})",
        "",
        f"Command: `{command}` ({summary['clips']} clips x {summary['repeat']}, {summary['seconds']} s).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, AVX2 {'yes' if m['avx2'] else 'no'}, AVX-512 "
        f"{'yes' if m['avx512'] else 'no'}, torch CPU capability {m['torch_cpu_capability']}; load average "
        f"at the end {m['load_average']} (the machine is shared: ratios measured side by side count).",
        "",
        "Streamed as live (see bench/asr_real.py): Silero endpointer, a partial every 300 ms and one at a "
        "100 ms pause, the final at speech_end; a clip the endpointer splits is scored on its finals joined. "
        "WER after normalising case, punctuation, titles and numbers (voiceagent/wer.py).",
        "",
    ]
    for path in dict.fromkeys(k.split("/")[1] for k in summary["results"]):
        title = "16 kHz as recorded" if path == "wideband" else "phone: 8 kHz mu-law in, as Twilio sends it"
        lines += [f"## {title}", "", *_table(summary["results"], path), ""]
    lines += ["## Every final", "", "| clip | path | model | WER | finals |", "|---|---|---|---|---|"]
    from voiceagent.wer import word_error_rate

    for (model, path), clip_runs in runs.items():
        for clip, run in clip_runs:
            text = " / ".join(run.finals).replace("|", "/")
            wer = word_error_rate(clip.text, " ".join(run.finals))
            lines.append(f"| {clip.name} | {path} | {model} | {wer:.2f} | {text} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
