"""Turn-taking on real recorded voices: where each system ends the turn of a real speaker.

    .venv/bin/python -m bench.turn_taking.real [--out bench/results/DATE-cpu-turn-taking-real.md]
        [--skip-pipecat] [--recordings FILE]

Every clip of the generated-speech bench (`python -m bench.turn_taking`) is synthesised: its pauses are
silence spliced into one synthesis, and its voices are two. This one plays the real recordings that
`make setup` fetches (voiceagent/real_speech.py) through the same systems (bench/turn_taking/systems.py):
the 320 ms silence rule, our words' score (defaults), our words fused with Smart Turn (the weight the
generated bench tried, 0.25) and Pipecat 1.14's Smart Turn, in the same run. Two kinds of turns:

- paused: a real speaker pausing mid-sentence. JFK's "And so my fellow Americans, | ask not | what your
  country can do for you, | ask what you can do for your country" (pauses of ~1.0, ~1.0 and ~0.5 s, as he
  spoke them), and LibriVox's reader at a comma: "He was not an ill disposed young man, | unless to be
  rather cold hearted ..." (the book's two consecutive recordings played one after the other, the
  reader's own pause between them).
- complete: a real sentence and the silence after it (CMU ARCTIC, LibriVox).

Per clip and system: where the turn ended (cut inside the speech, or the wait after its end); per pause,
what each model said inside it (the words' highest score, Smart Turn's probability on the same partial's
audio). The reference end of speech is where the recording's 10 ms level last rises above its noise floor
(`reference_end_s`), except JFK's, whose last 0.8 s is the crowd's applause: read by hand from its level
(10.18 s into the recording; "country" ends there). Too few clips for rates: read them one by one.
The LAST line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.turn_taking.clips import Clip
from bench.turn_taking.ours import Recording, Scored, head_scored, raw_scores
from bench.turn_taking.pipecat_env import PIPECAT_REQUIREMENT
from bench.turn_taking.report import Outcome
from bench.turn_taking.systems import (
    BASELINE_MS,
    RAW_WORDS,
    WITH_AUDIO,
    WORDS,
    log,
    machine,
    our_outcomes,
    pipecat_outcomes,
    recordings_of,
    uptime,
    without_delay,
)
from voiceagent.audio import SAMPLE_RATE, write_wav
from voiceagent.speech_models import cache_root

LEAD_S = 0.5  # silence before the recording, as the generated clips have
TRAIL_S = 3.6  # after it: Pipecat waits up to 3 s more when Smart Turn says "not yet"
FRAME_S = 0.01  # the level envelope's frame
FLOOR_MARGIN_DB = 12.0  # speech: a frame this far above the noise floor ...
PEAK_RANGE_DB = 40.0  # ... and within this of the speech's peak


@dataclass(frozen=True)
class RealTurn:
    """One turn made of real recordings (voiceagent/real_speech.py names), played one after the other."""

    name: str
    kind: str  # "pause" (paused mid-sentence) or "complete"
    sources: tuple[str, ...]
    text: str
    end_in_source_s: float | None = None  # read by hand, in the last source's time (None: reference_end_s)


REAL_TURNS = (
    RealTurn(
        "jfk",
        "pause",
        ("jfk",),
        "And so my fellow Americans, | ask not | what your country can do for you, | ask what you can do "
        "for your country.",
        end_in_source_s=10.18,
    ),
    RealTurn(
        "librivox-0880-0890",
        "pause",
        ("librivox-0880", "librivox-0890"),
        "He was not an ill disposed young man, | unless to be rather cold hearted and rather selfish is to "
        "be ill disposed.",
    ),
    RealTurn(
        "arctic-a0007",
        "complete",
        ("arctic-a0007",),
        "And you always want to see it in the superlative degree.",
    ),
    RealTurn(
        "arctic-a0009",
        "complete",
        ("arctic-a0009",),
        "He turned sharply, and faced Gregson across the table.",
    ),
    RealTurn(
        "librivox-0870",
        "complete",
        ("librivox-0870",),
        "And mister John Dashwood had then leisure to consider how much there might be prudently in his "
        "power to do for them.",
    ),
    RealTurn(
        "librivox-0890",
        "complete",
        ("librivox-0890",),
        "Unless to be rather cold hearted and rather selfish is to be ill disposed.",
    ),
)


def level_db(audio: np.ndarray) -> np.ndarray:
    """[n] int16 -> [n // 160] the level of each 10 ms frame, dBFS."""
    frame = int(FRAME_S * SAMPLE_RATE)
    n = audio.size // frame
    x = audio[: n * frame].astype(np.float64).reshape(n, frame) / 32768.0
    return 10.0 * np.log10((x**2).mean(axis=1) + 1e-12)


def reference_end_s(audio: np.ndarray) -> float:
    """The end of the last 10 ms frame of speech in a recording: above both its noise floor (the 10th
    percentile of its frames that are not digital silence) by FLOOR_MARGIN_DB and its peak (95th
    percentile) less PEAK_RANGE_DB."""
    levels = level_db(audio)
    heard = levels[levels > -99.0]
    if heard.size == 0:
        raise ValueError("the recording is digital silence: no end of speech to find")
    threshold = max(np.percentile(heard, 10) + FLOOR_MARGIN_DB, np.percentile(levels, 95) - PEAK_RANGE_DB)
    loud = np.flatnonzero(levels > threshold)
    return float(loud[-1] + 1) * FRAME_S


def build_real_clips(directory: Path) -> list[Clip]:
    """REAL_TURNS as clips written into `directory`: LEAD_S of silence, the recordings, TRAIL_S more."""
    from voiceagent.real_speech import load_clips

    sources = {c.name: c for c in load_clips(log=log)}
    directory.mkdir(parents=True, exist_ok=True)
    clips = []
    for turn in REAL_TURNS:
        parts = [sources[name].audio for name in turn.sources]
        lead = np.zeros(int(LEAD_S * SAMPLE_RATE), np.int16)
        audio = np.concatenate([lead, *parts, np.zeros(int(TRAIL_S * SAMPLE_RATE), np.int16)])
        before_last = LEAD_S + sum(p.size for p in parts[:-1]) / SAMPLE_RATE
        if turn.end_in_source_s is not None:
            end_s = before_last + turn.end_in_source_s
        else:
            end_s = before_last + reference_end_s(parts[-1])
        path = directory / f"real-{turn.name}.wav"
        write_wav(path, audio, SAMPLE_RATE)
        text = turn.text.replace(" |", "")
        clips.append(Clip(turn.name, turn.kind, "report", "real", text, (), end_s, str(path)))
    return clips


def where(outcome: Outcome, clip: Clip) -> str:
    """A turn end in words: cut inside the speech (at s), the wait after it (ms), or never."""
    if outcome.end_s is None:
        return "never ended"
    if outcome.end_s < clip.speech_end_s:
        return f"**cut** at {outcome.end_s:.2f} s"
    return f"+{1000 * (outcome.end_s - clip.speech_end_s):.0f} ms"


def pause_scores(rec: Recording) -> list[str]:
    """For a paused clip: per silence inside its speech (the partials at a pause, grouped by the words
    they heard), the words' score and Smart Turn's probability on the same partial's audio."""
    inside = [
        s
        for s in rec.scored
        if s.pause and s.score is not None and s.heard_until_ns / 1e9 < rec.clip.speech_end_s
    ]
    groups: dict[str, list[Scored]] = {}
    for s in inside:
        groups.setdefault(" ".join(s.text.lower().strip(" .,?!").split()), []).append(s)
    lines = []
    for words, partials in groups.items():
        scores = max(p.score or 0.0 for p in partials)
        audio = [p.audio_score for p in partials if p.audio_score is not None]
        heard = max(audio) if audio else None
        shown = "—" if heard is None else f"{heard:.3f}"
        lines.append(f"| {rec.clip.name} | …{words[-40:]} | {scores:.4f} | {shown} |")
    return lines


def results_page(
    clips: Sequence[Clip],
    recordings: Sequence[Recording],
    outcomes: dict[str, dict[str, Outcome]],
    before: str,
) -> list[str]:
    about = machine()
    names = list(outcomes)
    lines = [
        f"# Turn-taking on real voices ({datetime.date.today()}, CPU)",
        "",
        "Command: `.venv/bin/python -m bench.turn_taking.real` (in `make bench`).",
        "",
        f"Machine: {about['cpu']}, {about['vector']}, torch CPU capability {about['torch_cpu_capability']}, "
        f"{about['cores']} threads. Load before: `{before}`; after: `{uptime()}`. Pipecat: "
        f"`{PIPECAT_REQUIREMENT}`, its own virtualenv, same run.",
        "",
        "Where each system ended the first turn: cut inside the speech, or its wait after the end of speech.",
        "",
        "| clip | kind | end of speech (s) | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for clip in clips:
        cells = [where(outcomes[n][clip.name], clip) if clip.name in outcomes[n] else "—" for n in names]
        lines.append(f"| {clip.name} | {clip.kind} | {clip.speech_end_s:.2f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Inside the pauses of the paused clips (the partials decoded there): the words' highest end-of-turn "
        "score (a turn ends at once at >= 0.4 and waits 2 s at <= 0.01) and Smart Turn v3.2's probability on "
        "the same audio (it calls > 0.5 complete).",
        "",
        "| clip | heard before the pause | words' score | Smart Turn |",
        "|---|---|---|---|",
        *(line for rec in recordings if rec.clip.kind == "pause" for line in pause_scores(rec)),
        "",
        "Texts (`|`: the speaker's pauses):",
        "",
        *(f"- {t.name}: {t.text}" for t in REAL_TURNS),
        "",
    ]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path(f"bench/results/{datetime.date.today()}-cpu-turn-taking-real.md")
    )
    parser.add_argument("--skip-pipecat", action="store_true", help="leave Pipecat's Smart Turn out")
    parser.add_argument(
        "--recordings", type=Path, help="reuse the recordings kept in this file (made if absent)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    before = uptime()
    clips = build_real_clips(cache_root() / "turn-taking-real")
    recordings = recordings_of(clips, args.recordings)
    instant = [without_delay(r) for r in recordings]
    outcomes = {
        f"silence {BASELINE_MS} ms": our_outcomes(recordings, BASELINE_MS, held=True),
        "words (defaults)": our_outcomes(recordings, WORDS, held=True),
        "words, no compute delay": our_outcomes(instant, WORDS, held=True),
        "words + Smart Turn 0.25": our_outcomes(recordings, WITH_AUDIO, held=True),
        "words + Smart Turn 0.25, no compute delay": our_outcomes(instant, WITH_AUDIO, held=True),
    }
    if head_scored(recordings):
        outcomes["raw score, no head"] = our_outcomes(
            [raw_scores(r) for r in recordings], RAW_WORDS, held=True
        )
    if not args.skip_pipecat:
        outcomes["Pipecat 1.14 Smart Turn v3.2"], _ = pipecat_outcomes(clips)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(results_page(clips, recordings, outcomes, before)))
    log(f"wrote {args.out}")
    ends = {
        name: {c: (None if o.end_s is None else round(o.end_s, 3)) for c, o in by_clip.items()}
        for name, by_clip in outcomes.items()
    }
    ends["speech_end_s"] = {c.name: round(c.speech_end_s, 3) for c in clips}
    print(
        json.dumps(
            {"results": str(args.out), "ends_s": ends, "clips": [dataclasses.asdict(c) for c in clips]}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
