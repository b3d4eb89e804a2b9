"""The systems the turn-taking benches compare, run on any clips: ours (recorded once through the real
components, bench/turn_taking/ours.py, then replayed under a policy) and Pipecat's Smart Turn (its own
virtualenv, bench/turn_taking/pipecat_env.py); and the machine they ran on.

Used by the generated-speech bench (`python -m bench.turn_taking`) and the real-voices one
(`python -m bench.turn_taking.real`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from bench.turn_taking.clips import Clip
from bench.turn_taking.ours import Recording, Scored, record, replay
from bench.turn_taking.pipecat_env import run_pipecat
from bench.turn_taking.report import Outcome
from voiceagent.turn_taking import TurnTakingOptions

BASELINE_MS = 320
# The score of the words alone, and fused with Smart Turn's audio probability (turn_taking.fused_score)
WORDS = TurnTakingOptions(audio_weight=0.0)
WITH_AUDIO = TurnTakingOptions(audio_weight=0.25, audio_bias=2.0)
# The model's raw score without its trained head (LocalLLM turn_head=False), under the thresholds that were
# the defaults for it until the head (2026-12-06)
RAW_WORDS = TurnTakingOptions(complete_score=0.4, incomplete_score=0.01, early_complete_score=0.6)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def record_all(clips: list[Clip], pause_quiet_ms: int | None = None) -> list[Recording]:
    """Every clip through our components (ours.record); `pause_quiet_ms`: the partial schedule's (None:
    the session's, VOICEAGENT_TURN_PAUSE_QUIET_MS)."""
    from voiceagent.config import Settings
    from voiceagent.llm import LocalLLM, load_local_engine
    from voiceagent.session import SessionOptions
    from voiceagent.smart_turn import SmartTurn

    system_prompt = SessionOptions().system_prompt

    settings = Settings()
    template = LocalLLM(
        load_local_engine(settings), turn_score_model=settings.turn_score_model, turn_head=settings.turn_head
    )
    await template.prefill([{"role": "system", "content": system_prompt}, {"role": "user", "content": "Hi"}])
    from voiceagent.recognizers import load_asr_model, new_recognizer

    asr_model = Settings().asr_model  # the session's recogniser (VOICEAGENT_ASR_MODEL)
    load_asr_model(asr_model)
    turn_audio = SmartTurn()  # every scored partial's audio, so both policies replay from one recording
    recordings: list[Recording] = []
    quiet_ms = settings.turn_pause_quiet_ms if pause_quiet_ms is None else pause_quiet_ms
    for n, clip in enumerate(clips, start=1):
        llm = template.fork()  # as each session forks the pipeline's warmed template
        recognizer = new_recognizer(asr_model)
        recordings.append(
            await record(clip, recognizer, llm, system_prompt, turn_audio, pause_quiet_ms=quiet_ms)
        )
        log(f"ours: {n}/{len(clips)} {clip.name}")
    return recordings


def save_recordings(path: Path, recordings: list[Recording]) -> None:
    rows = [{**dataclasses.asdict(r), "clip": r.clip.name} for r in recordings]
    path.write_text(json.dumps(rows))


def load_recordings(path: Path, clips: list[Clip]) -> list[Recording]:
    by_name = {c.name: c for c in clips}
    recordings = []
    for row in json.loads(path.read_text()):
        if row["clip"] in by_name:
            scored = [Scored(**s) for s in row["scored"]]
            recordings.append(
                Recording(
                    by_name[row["clip"]],
                    row["probabilities"],
                    scored,
                    row["speech_start_ns"],
                    row["final_text"],
                )
            )
    log(f"reused {len(recordings)} recordings from {path}")
    return recordings


def heard_real_words(rec: Recording) -> bool:
    """Whether the session would interrupt its held reply on this utterance's partials or final."""
    from voiceagent.barge_in import interrupts

    return any(interrupts(s.text, final=False) for s in rec.scored) or interrupts(rec.final_text, final=True)


def our_outcomes(recs: list[Recording], policy: TurnTakingOptions | int, held: bool) -> dict[str, Outcome]:
    outcomes = {}
    for rec in recs:
        end = replay(rec, policy)
        start_s = None if end.speech_start_ns is None else end.speech_start_ns / 1e9
        interrupted = start_s is not None and (heard_real_words(rec) if held else True)
        outcomes[rec.clip.name] = Outcome(
            start_s, None if end.end_ns is None else end.end_ns / 1e9, interrupted
        )
    return outcomes


def without_delay(rec: Recording) -> Recording:
    scored = [dataclasses.replace(s, known_ns=s.heard_until_ns, audio_s=0.0) for s in rec.scored]
    return dataclasses.replace(rec, scored=scored)


def pipecat_outcomes(clips: list[Clip]) -> tuple[dict[str, Outcome], list[float]]:
    raw = run_pipecat([{"name": c.name, "path": c.path} for c in clips], log)
    outcomes, inferences = {}, []
    for name, result in raw.items():
        starts = result["starts_s"]
        assert isinstance(starts, list)
        end_s = result["end_s"]
        outcomes[name] = Outcome(starts[0] if starts else None, end_s, bool(starts))  # type: ignore[arg-type]
        inferences += result["inference_s"]  # type: ignore[arg-type]
    return outcomes, inferences


def machine() -> dict[str, str]:
    import torch

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line), "?")
    flags = open("/proc/cpuinfo").read()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512"
    return {
        "cpu": model,
        "vector": vector,
        "torch_cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "cores": str(torch.get_num_threads()),
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def recordings_of(clips: list[Clip], kept: Path | None, pause_quiet_ms: int | None = None) -> list[Recording]:
    """The clips' recordings: reused from `kept` if it exists, else recorded (and kept there if given)."""
    if kept is not None and kept.exists():
        return load_recordings(kept, clips)
    recordings = asyncio.run(record_all(clips, pause_quiet_ms))
    if kept is not None:
        save_recordings(kept, recordings)
    return recordings
