"""The comparison's figures: one summary (the JSON object of the last stdout line) and its markdown page."""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from bench.voice_vs_pipecat.timeline import (
    STAGES,
    SYSTEMS,
    ClipRun,
    paired_ratios,
    ratio,
    system_summary,
)

EXTRAS = {"ours": ("vad_speech_end",), "pipecat": ("vad_stop",)}
LABELS = {"ours": "ours (voiceagent)", "pipecat": "Pipecat 1.14"}


def summarize(clips: Sequence[ClipRun], meta: dict[str, Any]) -> dict[str, Any]:
    """Both systems' figures, the ratios ours / Pipecat, the run's facts (`meta`) and every clip."""
    systems = {s: system_summary(clips, s, EXTRAS[s]) for s in SYSTEMS}
    v2v = {s: systems[s]["voice_to_voice"] for s in SYSTEMS}
    paired = paired_ratios(clips)
    return {
        "clips": len(clips),
        **systems,
        "ratio_ours_over_pipecat": {
            "p50": ratio(v2v["ours"]["p50"], v2v["pipecat"]["p50"]),
            "p95": ratio(v2v["ours"]["p95"], v2v["pipecat"]["p95"]),
            "paired_median": round(statistics.median(paired), 3) if paired else None,
        },
        **meta,
        "clips_detail": [asdict(c) for c in clips],
    }


def machine() -> dict[str, str]:
    import torch

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line), "?")
    flags = set(open("/proc/cpuinfo").read().split())
    return {
        "cpu": model,
        "avx2": "yes" if "avx2" in flags else "no",
        "avx512f": "yes" if "avx512f" in flags else "no",
        "torch_cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "cores": str(len(os.sched_getaffinity(0))),
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _models(models: dict[str, Any] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in models.items()) if models else "—"


def stage_table(summary: dict[str, Any]) -> list[str]:
    rows = [
        "| stage (ms after speech end) | ours p50 | ours p95 | Pipecat p50 | Pipecat p95 |",
        "|---|---|---|---|---|",
    ]
    for stage in (*STAGES, "vad_speech_end", "vad_stop"):
        ours, pipecat = summary["ours"].get(stage), summary["pipecat"].get(stage)
        cells = [_ms(f["p50"]) + " | " + _ms(f["p95"]) if f else "— | —" for f in (ours, pipecat)]
        rows.append(f"| {stage} | {cells[0]} | {cells[1]} |")
    return rows


def clip_table(summary: dict[str, Any]) -> list[str]:
    rows = [
        "| # | voice | first | ours v2v | Pipecat v2v | ours transcript | Pipecat transcript |",
        "|---|---|---|---|---|---|---|",
    ]
    for clip in summary["clips_detail"]:
        runs = clip["runs"]
        v2v = [_ms(runs[s]["latency_ms"].get("voice_to_voice")) for s in SYSTEMS]
        said = [runs[s]["transcript"].replace("|", "/") for s in SYSTEMS]
        cells = [str(clip["index"]), clip["voice"], clip["first"], *v2v, *said]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def markdown(summary: dict[str, Any], notes: Sequence[str]) -> str:
    m, r = summary["machine"], summary["ratio_ours_over_pipecat"]
    v2v = {s: summary[s]["voice_to_voice"] for s in SYSTEMS}
    lines = [
        f"# Voice to voice: ours vs Pipecat 1.14, same clips, same run ({summary['date']})",
        "",
        f"Command: `{summary['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, AVX2 {m['avx2']}, AVX-512 {m['avx512f']}, torch CPU "
        f"capability {m['torch_cpu_capability']}. Load before: `{summary['load_before']}`; after: "
        f"`{summary['load_after']}`.",
        "",
        f"Ours: {_models(summary.get('ours_models'))}. Pipecat: "
        f"`{' '.join(summary.get('pipecat_requirements', []))}`.",
        "",
        f"{summary['clips']} clips ({summary['order']}). Voice to voice p50 / p95: ours "
        f"{_ms(v2v['ours']['p50'])} / {_ms(v2v['ours']['p95'])} ms, Pipecat {_ms(v2v['pipecat']['p50'])} / "
        f"{_ms(v2v['pipecat']['p95'])} ms; ratio ours / Pipecat {r['p50']} (p50), {r['p95']} (p95), per-clip "
        f"median {r['paired_median']}. Answered: ours {summary['ours']['clips_answered']}, Pipecat "
        f"{summary['pipecat']['clips_answered']}. Mean WER: ours {summary['ours']['mean_word_error_rate']}, "
        f"Pipecat {summary['pipecat']['mean_word_error_rate']}. Errors: ours {summary['ours']['errors']}, "
        f"Pipecat {summary['pipecat']['errors']}.",
        "",
        *stage_table(summary),
        "",
        *clip_table(summary),
        "",
        *notes,
        "",
    ]
    return "\n".join(lines)
