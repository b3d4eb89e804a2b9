"""The one reference both systems are timed from, and each clip's figures (pure: no models, no clock).

A clip is pushed from `t0_ns` on, 20 ms a frame on a schedule, so its sample `i` is heard at
`t0_ns + i / 16 kHz`. The end of the user's speech is the end of the clip's last loud sample (|x| > 300,
about -40 dBFS: the turn-taking bench's reference), the same instant for both systems whatever their VADs
decide. Every stage is reported in ms after it; voice to voice is the first bot audio frame's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.turn_taking.clips import LOUD
from voiceagent.audio import SAMPLE_RATE
from voiceagent.replay.stats import latency_summary

# The stages both systems have, in pipeline order (what each means per system: see __main__'s NOTES).
STAGES = ("turn_end", "transcript", "first_text", "tts_first_audio", "voice_to_voice")
SYSTEMS = ("ours", "pipecat")


def speech_end_s(audio: np.ndarray, loud: int = LOUD) -> float:
    """[n] int16 PCM16 16 kHz -> seconds from its first sample to the end of its last sample above `loud`."""
    if audio.ndim != 1 or audio.dtype != np.int16:
        raise ValueError(f"expected [n] int16 audio, got {audio.dtype} {audio.shape}")
    above = np.flatnonzero(np.abs(audio.astype(np.int32)) > loud)
    if above.size == 0:
        raise ValueError(f"the clip has no sample above {loud}: nothing was said")
    return float(above[-1] + 1) / SAMPLE_RATE


def after_speech_ms(times_ns: Mapping[str, int | None], t0_ns: int, end_s: float) -> dict[str, float | None]:
    """Each event's monotonic ns -> ms after the speech end (`end_s` into a clip pushed from `t0_ns`)."""
    end_ns = t0_ns + round(end_s * 1e9)
    return {name: None if t is None else round((t - end_ns) / 1e6, 1) for name, t in times_ns.items()}


@dataclass
class SystemRun:
    """One system's run of one clip."""

    transcript: str = ""
    reply: str = ""
    word_error_rate: float | None = None
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # STAGES (and extras), after speech end
    errors: list[str] = field(default_factory=list)


@dataclass
class ClipRun:
    index: int
    voice: str
    question: str
    speech_end_s: float
    first: str  # which system ran it first
    runs: dict[str, SystemRun] = field(default_factory=dict)


def stage_values(clips: Sequence[ClipRun], system: str, stage: str) -> list[float]:
    return [v for c in clips if (v := c.runs[system].latency_ms.get(stage)) is not None]


def system_summary(clips: Sequence[ClipRun], system: str, extras: Sequence[str] = ()) -> dict[str, Any]:
    """p50/p95/max of every stage over the clips, the mean WER and the error count of one system."""
    wers = [w for c in clips if (w := c.runs[system].word_error_rate) is not None]
    summary: dict[str, Any] = {s: latency_summary(stage_values(clips, system, s)) for s in (*STAGES, *extras)}
    summary["mean_word_error_rate"] = round(float(np.mean(wers)), 3) if wers else None
    summary["errors"] = sum(len(c.runs[system].errors) for c in clips)
    summary["clips_answered"] = len(stage_values(clips, system, "voice_to_voice"))
    return summary


def ratio(ours: float | None, pipecat: float | None) -> float | None:
    """ours / Pipecat (below 1: ours is faster), None when either is missing."""
    if ours is None or pipecat is None or pipecat <= 0:
        return None
    return round(ours / pipecat, 3)


def paired_ratios(clips: Sequence[ClipRun], stage: str = "voice_to_voice") -> list[float]:
    """Per clip ours / Pipecat, on the clips both answered."""
    out = []
    for clip in clips:
        r = ratio(clip.runs["ours"].latency_ms.get(stage), clip.runs["pipecat"].latency_ms.get(stage))
        if r is not None:
            out.append(r)
    return out
