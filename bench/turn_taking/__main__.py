"""Turn-taking on generated speech: the fixed silence rule, our end-of-turn score, Pipecat's Smart Turn.

    .venv/bin/python -m bench.turn_taking [--out bench/results/DATE-cpu-turn-taking.md] [--skip-pipecat]
        [--noise-dbfs -50]

Clips (bench/turn_taking/clips.py): complete questions, sentences with 0.5-1.0 s pauses mid-sentence, lists,
hesitations and backchannels, each sentence in Piper's and espeak-ng's voice, rendered once into
$VOICEAGENT_CACHE/turn-taking. Ours (bench/turn_taking/ours.py): every clip streamed once through the real
Endpointer, the session's recogniser (VOICEAGENT_ASR_MODEL) and LocalLLM score on the bundled models, then the
first turn end replayed under the 320 ms silence rule (today), under the score policy with options tuned on
the tuning clips (reported on the others) and under the default one, and under both as if partials and
scores took no time (what each policy decides, apart from this machine's speed). Pipecat
(bench/turn_taking/pipecat_turns.py): Pipecat 1.14's Silero VAD + Smart Turn v3.2, in its own virtualenv
(made on first use), on the same clips in the same run. `--noise-dbfs`: the same clips with pink noise at that
RMS level under them (clips.with_noise), as a real microphone or line has. With `VOICEAGENT_TURN_HEAD=1` the
draft's trained head scores (engine/turn_head.py) and the raw score is recorded beside it: the "raw score,
no head" rows replay the same recording with it.

Figures per class: endpoint wait from the end of speech (p50/p95), cut-off rate (the turn ended before the
speech did), false interruptions (a backchannel over the agent's reply that would cut it: for today and for
Pipecat every detected speech start does; with the held reply of voiceagent/barge_in.py only a start whose
transcript has real words). Progress goes to stderr; the LAST line on stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
from pathlib import Path

import numpy as np

from bench.turn_taking import report
from bench.turn_taking.clips import Clip, build_clips, with_noise
from bench.turn_taking.ours import Recording, head_scored, raw_scores, replay
from bench.turn_taking.pipecat_env import PIPECAT_REQUIREMENT
from bench.turn_taking.report import ClassFigures, Outcome
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
from voiceagent.speech_models import cache_root
from voiceagent.turn_taking import TurnTakingOptions

GRID = {
    "complete_silence_ms": (40, 80, 120),
    "complete_score": (0.01, 0.02, 0.05, 0.1, 0.2, 0.4),
    "incomplete_score": (0.001, 0.003, 0.01),
    "pending_silence_ms": (500, 700, 900),
    "incomplete_silence_ms": (1500, 2000),
    "early_complete_score": (0.4, 0.6, 0.8),  # at complete_score: no early rule
}
# Not tuned: a number being dictated is paused in, and few tuning clips hold one (with the rule left to the
# grid, one run kept it and the next dropped it and cut two dictated numbers short); the heard slack (80 ms,
# what Silero's voiced chunks run on past a word), and the settled silence (100 ms: between the two pause
# partials). The session's defaults are reported beside the tuned policy: on 36 tuning clips one cut more
# or less is a 3-5% step, so the tuned choice of a run is not always the defaults.


NOTES = [
    "How to read it:",
    "",
    "- The endpoint wait runs from the end of speech in the audio (its last sample above -40 dBFS), the same "
    "for every system; Silero's voiced chunks run on ~50-100 ms past it, so the 320 ms rule reads "
    "~370-400 ms.",
    "- Cut off: the turn ended before the speech did (inside a pause; for complete clips, in the words).",
    "- Ours is timed on this machine as it was loaded (see `uptime`): a partial's decode and its score delay "
    "the decision by their measured wall time. 'No compute delay' replays the same scores under the same "
    "policy as if they came at once: what the policy decides, apart from this machine's speed.",
    "- Pipecat ends a turn when its VAD has heard 0.2 s of silence and Smart Turn says complete (plus the "
    "inference's measured time), else after 3 s more; the wait for a final transcript that Pipecat adds is "
    "left out, so its waits are a lower bound.",
    "- False interruptions (backchannels over the agent's reply): today and in Pipecat's default pipeline "
    "every detected speech start interrupts; with the held reply (voiceagent/barge_in.py) only a start whose "
    "final holds real words, or a partial more than three words or a stop word (`barge_in.interrupts`).",
]


def percentiles_ms(values: list[float]) -> str:
    if not values:
        return "—"
    return f"p50 {1000 * np.percentile(values, 50):.0f} ms, p95 {1000 * np.percentile(values, 95):.0f} ms"


def _keep(kept: dict[tuple[str, str], int], clip: Clip) -> bool:
    kept[clip.kind, clip.subset] += 1
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path(f"bench/results/{datetime.date.today()}-cpu-turn-taking.md")
    )
    parser.add_argument("--skip-pipecat", action="store_true", help="leave Pipecat's Smart Turn out")
    parser.add_argument(
        "--noise-dbfs",
        type=float,
        help="pink noise at this RMS level (e.g. -50) under every clip, both systems",
    )
    parser.add_argument(
        "--pause-quiet-ms",
        type=int,
        help="start the first pause partial after this much quiet too (default: the session's, "
        "VOICEAGENT_TURN_PAUSE_QUIET_MS; 0: on Silero's silence alone)",
    )
    parser.add_argument("--limit", type=int, default=0, help="at most this many clips per class and subset")
    parser.add_argument("--dump", type=Path, help="write every clip's partials, scores and turn ends here")
    parser.add_argument(
        "--recordings",
        type=Path,
        help="reuse the recordings kept in this file (made and kept there if absent)",
    )
    return parser.parse_args(argv)


def tuned(tune: list[Clip], recordings: list[Recording], base: TurnTakingOptions) -> TurnTakingOptions:
    """The grid's policy (`base` with the grid's values) with the lowest tuning cost (report.tuning_cost)
    on the tuning clips."""

    def cost(options: object) -> tuple[float, ...]:
        assert isinstance(options, TurnTakingOptions)
        return report.tuning_cost(tune, our_outcomes(recordings, options, held=True))

    candidates = report.grid(base, **GRID)
    log(f"tuning the policy on the tuning clips: {len(candidates)} candidates")
    chosen = report.best(candidates, cost)
    assert isinstance(chosen, TurnTakingOptions)
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = uptime()
    clips = build_clips(cache_root() / "turn-taking", log)
    if args.noise_dbfs is not None:
        clips = with_noise(clips, args.noise_dbfs, cache_root() / "turn-taking")
    if args.limit:
        kept: dict[tuple[str, str], int] = {}
        clips = [c for c in clips if kept.setdefault((c.kind, c.subset), 0) < args.limit and _keep(kept, c)]
    tune = [c for c in clips if c.subset == "tune"]
    shown = [c for c in clips if c.subset == "report"]
    recordings = recordings_of(clips, args.recordings, args.pause_quiet_ms)
    reported = [r for r in recordings if r.clip.subset == "report"]
    tuning = [r for r in recordings if r.clip.subset == "tune"]
    chosen = tuned(tune, tuning, WORDS)
    chosen_audio = tuned(tune, tuning, WITH_AUDIO)
    instant = [without_delay(r) for r in reported]  # the same scores, as if they came at once
    outcomes = {
        f"silence {BASELINE_MS} ms (today)": our_outcomes(reported, BASELINE_MS, held=False),
        "score (tuned)": our_outcomes(reported, chosen, held=True),
        "score (defaults)": our_outcomes(reported, WORDS, held=True),
        "score (tuned), no compute delay": our_outcomes(instant, chosen, held=True),
        "score (defaults), no compute delay": our_outcomes(instant, WORDS, held=True),
        "score + Smart Turn (tuned)": our_outcomes(reported, chosen_audio, held=True),
        "score + Smart Turn (defaults)": our_outcomes(reported, WITH_AUDIO, held=True),
        "score + Smart Turn (defaults), no compute delay": our_outcomes(instant, WITH_AUDIO, held=True),
    }
    chosen_both = {"words": chosen, "words + Smart Turn": chosen_audio}
    if head_scored(recordings):
        raw_reported = [raw_scores(r) for r in reported]
        chosen_both["raw score, no head"] = chosen_raw = tuned(
            tune, [raw_scores(r) for r in tuning], RAW_WORDS
        )
        outcomes["raw score, no head (tuned)"] = our_outcomes(raw_reported, chosen_raw, held=True)
        outcomes["raw score, no head (defaults)"] = our_outcomes(raw_reported, RAW_WORDS, held=True)
        raw_instant = [without_delay(r) for r in raw_reported]
        outcomes["raw score, no head (tuned), no compute delay"] = our_outcomes(
            raw_instant, chosen_raw, held=True
        )
    inferences: list[float] = []
    if not args.skip_pipecat:
        outcomes["Pipecat 1.14 Smart Turn v3.2"], inferences = pipecat_outcomes(shown)
    systems = {name: report.class_figures(shown, o) for name, o in outcomes.items()}
    if args.dump:
        dump(args.dump, recordings, chosen, outcomes.get("Pipecat 1.14 Smart Turn v3.2", {}))
    scored = [s for r in recordings for s in r.scored]
    timing = {
        "score_s": [s.score_s for s in scored if s.score is not None],
        "asr_s": [s.asr_s for s in scored],
        "audio_s": [s.audio_s for s in scored if s.audio_score is not None],
    }
    misses = report.misses(reported, outcomes["score (tuned)"])
    counts = (len(tune), len(shown))
    write_results(
        args.out, systems, chosen_both, timing, inferences, load_before, counts, misses, args.noise_dbfs
    )
    summary = {
        "results": str(args.out),
        "chosen": dataclasses.asdict(chosen),
        "chosen_with_audio": dataclasses.asdict(chosen_audio),
        "systems": {n: {k: dataclasses.asdict(f) for k, f in fs.items()} for n, fs in systems.items()},
        "score_ms_p50": 1000 * float(np.percentile(timing["score_s"], 50)),
    }
    print(json.dumps(summary))
    return 0


def dump(
    path: Path, recordings: list[Recording], chosen: TurnTakingOptions, pipecat: dict[str, Outcome]
) -> None:
    """Per clip: what was heard and scored, and where each system ended the turn (seconds)."""
    rows = []
    for rec in recordings:
        ends = {"today": replay(rec, BASELINE_MS).end_ns, "score": replay(rec, chosen).end_ns}
        rows.append({
            "clip": dataclasses.asdict(rec.clip),
            "ends_s": {k: None if v is None else v / 1e9 for k, v in ends.items()},
            "pipecat": dataclasses.asdict(pipecat[rec.clip.name]) if rec.clip.name in pipecat else None,
            "scored": [dataclasses.asdict(s) for s in rec.scored],
            "final": rec.final_text,
        })  # fmt: skip
    path.write_text(json.dumps(rows, indent=1))


def write_results(
    out: Path,
    systems: dict[str, dict[str, ClassFigures]],
    chosen: dict[str, TurnTakingOptions],
    timing: dict[str, list[float]],
    inferences: list[float],
    load_before: str,
    n_clips: tuple[int, int],
    misses: list[str],
    noise_dbfs: float | None = None,
) -> None:
    from voiceagent.config import Settings

    about = machine()
    lines = [
        f"# Turn-taking on generated speech ({datetime.date.today()}, CPU)",
        "",
        "Command: `.venv/bin/python -m bench.turn_taking"
        + ("" if noise_dbfs is None else f" --noise-dbfs {noise_dbfs:g}")
        + "` (in `make bench`).",
        "",
        f"Machine: {about['cpu']}, {about['vector']}, torch CPU capability {about['torch_cpu_capability']}, "
        f"{about['cores']} threads. Load before: `{load_before}`; after: `{uptime()}`.",
        "",
        f"Clips: {n_clips[0]} to tune on, {n_clips[1]} reported (other sentences), each sentence in Piper "
        "(en_US-joe-medium) and espeak-ng (en-us) voices. Pipecat: "
        f"`{PIPECAT_REQUIREMENT}`, its own virtualenv."
        + ("" if noise_dbfs is None else f" Under every clip, pink noise at {noise_dbfs:g} dBFS RMS."),
        "",
        *report.table(systems),
        "",
        *(
            f"Policy chosen on the tuning clips ({name}): `{dataclasses.asdict(options)}`."
            for name, options in chosen.items()
        ),
        "",
        f"Time per end-of-turn score (LocalLLM, `VOICEAGENT_TURN_SCORE_MODEL={Settings().turn_score_model}`, "
        "warm cache): "
        f"{percentiles_ms(timing['score_s'])}; "
        f"per partial transcript: {percentiles_ms(timing['asr_s'])}; per Smart Turn inference: ours (one "
        f"thread, after the score) {percentiles_ms(timing['audio_s'])}, "
        f"Pipecat's {percentiles_ms(inferences)}.",
        "",
        *NOTES,
        "",
        "What the tuned score got wrong on the reported clips:",
        "",
        *misses,
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    log(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
