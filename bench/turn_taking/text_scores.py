"""Which model's end-of-turn score separates finished words from unfinished ones, on text alone.

`python -m bench.turn_taking.text_scores` scores written utterances (no audio, no recogniser) with the
bundled pair, once on the draft's cache and once on the target's (`Conversation.end_of_turn_probability`'s
`model`), and by each one's trained head where it has one (engine/turn_head.py), through
`LocalLLM.end_of_turn_probability` as the session scores a partial: the speech system prompt, the words
without their final mark. Each line of a text file is an utterance, a "|" where a speaker
may pause: every prefix up to a "|" is an unfinished turn, the whole line a finished one. Two sets:
`score_texts.txt` (written for this, used by nothing else) and the turn-taking clips' sentences
(bench/turn_taking/clips.py, tuning and reported together). Nothing here tunes a threshold.

Per model and set: the AUC (the chance a finished utterance outscores an unfinished one), the share of
finished ones at or above the policy's `complete_score` and `early_complete_score`, the share of
unfinished ones whose wait would reach a second (below ~0.07 with the default policy), and the share of
finished ones above the highest unfinished score, and above all but the top 5% of them. The LAST line on
stdout is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.turn_taking.clips import TEXTS
from engine.engine_thread import on_engine_thread
from voiceagent.llm import LocalLLM
from voiceagent.turn_taking import DEFAULT_OPTIONS, end_silence_ms

if TYPE_CHECKING:
    from engine import Engine
    from engine.turn_end import ScoreModel

HERE = Path(__file__).parent
MODELS: tuple[ScoreModel, ...] = ("draft", "target")


def utterances(lines: list[str]) -> list[tuple[str, bool]]:
    """(words, finished) for every prefix up to a "|" (unfinished) and every whole line (finished)."""
    out = []
    for line in (raw.strip() for raw in lines):
        if not line:
            continue
        parts = [p.strip() for p in line.split("|")]
        out += [(" ".join(parts[:k]), False) for k in range(1, len(parts))]
        out.append((" ".join(parts), True))
    return out


def clip_lines() -> list[str]:
    return [
        t for kind, subsets in TEXTS.items() if kind != "backchannel" for s in subsets.values() for t in s
    ]


def auc(finished: np.ndarray, unfinished: np.ndarray) -> float:
    wins = [(f > unfinished).mean() + 0.5 * (f == unfinished).mean() for f in finished]
    return float(np.mean(wins))


def summary(scores: np.ndarray, finished: np.ndarray) -> dict[str, float]:
    done, cut = scores[finished], scores[~finished]
    options = DEFAULT_OPTIONS
    top5 = np.sort(cut)[::-1][int(0.05 * cut.size)] if cut.size else 0.0
    return {
        "auc": round(auc(done, cut), 3),
        "finished_at_complete_score": round(float((done >= options.complete_score).mean()), 3),
        "finished_at_early_score": round(float((done >= options.early_complete_score).mean()), 3),
        "unfinished_waiting_1s": round(float(np.mean([end_silence_ms(float(s)) >= 1000 for s in cut])), 3),
        "finished_above_all_unfinished": round(float((done > cut.max()).mean()), 3),
        "finished_above_95pct_unfinished": round(float((done > top5).mean()), 3),
    }


async def scores_of(
    engine: Engine, model: ScoreModel, texts: list[str], learned: bool = False
) -> list[float]:
    """Each text's end-of-turn score, scored as the session scores a partial (`LocalLLM`), on one
    conversation's cache of `model`; `learned`: by that model's trained head (engine/turn_head.py)."""
    from voiceagent.session_options import SPEECH_SYSTEM_PROMPT

    llm = LocalLLM(engine, turn_score_model=model, turn_head=learned)
    scores = []
    for text in texts:
        messages = [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, {"role": "user", "content": text}]
        score = await llm.end_of_turn_probability(messages)
        if score is None:
            raise RuntimeError(f"no end-of-turn score on the {model} for {text!r}")
        scores.append(score)
    return scores


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> None:
    from voiceagent.config import Settings
    from voiceagent.llm import load_local_engine

    engine = load_local_engine(Settings())
    sets = {"score_texts": (HERE / "score_texts.txt").read_text().splitlines(), "clip_texts": clip_lines()}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, lines in sets.items():
        items = utterances(lines)
        finished = np.array([f for _, f in items])
        n_done = int(finished.sum())
        counts = f"{n_done} finished, {finished.size - n_done} not"
        results[name] = {}
        for model in MODELS:
            for learned in (False, True) if model in engine.turn_heads else (False,):
                scores = asyncio.run(scores_of(engine, model, [text for text, _ in items], learned))
                label = f"{model} head" if learned else model
                results[name][label] = summary(np.array(scores), finished)
                print(f"{name} ({counts}), {label}: {results[name][label]}", file=sys.stderr, flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
