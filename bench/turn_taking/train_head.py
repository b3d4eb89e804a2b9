"""Train the end-of-turn head: a logistic classifier over the scoring model's next-token log-probabilities.

The raw score (engine/turn_end.py: P(end of turn or a final mark | words)) reads a finished question as
unfinished whenever the model expects more ("Can you recommend a good book" 0.005: "... for beginners").
A head trained on what people say to a voice assistant learns where its words end: its features are the
log-probabilities of K ids after the words (the ids that matter most there, picked on a sample) and the
raw score's logit; its label, 1 after a whole utterance, 0 after every shorter run of its words.

`python -m bench.turn_taking.train_head [--model draft|target]` reads bench/turn_taking/turn_corpus.txt
(written by `python -m bench.turn_taking.corpus`; none of the reported sentences), scores every utterance
and every prefix of it at a word boundary in two spellings (as written, and lowercased without marks, as
streaming recognisers often write a partial), each with its final marks dropped as the session does
(voiceagent.llm.END_MARKS), on the speech system prompt; picks the L2 weight on a fifth of the utterances
held out; refits on all; writes engine/turn_heads/<bundled model>.json; and prints, on stderr, the held-out
figures beside the raw score's. Progress on stderr. Evaluate it on the reported texts with
`python -m bench.turn_taking.text_scores` and on speech with `python -m bench.turn_taking`.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from bench.turn_taking.corpus import CORPUS
from bench.turn_taking.text_scores import auc
from engine.engine_thread import on_engine_thread
from engine.state import shared_prefix_length
from engine.turn_end import turn_marks, user_words
from engine.turn_head import HEADS, LOG_FLOOR, TurnHead, logit, raw_score
from voiceagent.llm import END_MARKS

if TYPE_CHECKING:
    from engine import Engine
    from engine.state import ModelState

N_IDS = 1024  # ids whose log-probabilities are features
SAMPLE_FOR_IDS = 300  # utterances whose mean next-token distribution picks them
L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)


def spellings(text: str) -> list[str]:
    """The utterance as written, and lowercased without marks (as a partial transcript may read)."""
    bare = re.sub(r"[^\w\s']", " ", text.lower())
    return [text, " ".join(bare.split())]


def prefixes(text: str) -> list[tuple[str, int]]:
    """(words so far without final marks, label) for every word boundary: 1 only for the whole text."""
    words = text.split()
    out = [(" ".join(words[:k]).rstrip(END_MARKS), 0) for k in range(1, len(words))]
    out.append((text.rstrip(END_MARKS), 1))
    return [(words_so_far, label) for words_so_far, label in out if words_so_far]


@dataclass
class Scorer:
    """One model's cache over the speech system prompt: log-probabilities after many prefixes at once."""

    engine: Engine
    state: ModelState
    cached: list[int]

    @classmethod
    def create(cls, engine: Engine, model: str) -> Scorer:
        conv = engine.new_conversation()
        state = conv.target if model == "target" or conv.draft is None else conv.draft
        return cls(engine, state, [])

    def prompt(self, words: str) -> list[int]:
        from engine import chat_prompt
        from voiceagent.session_options import SPEECH_SYSTEM_PROMPT

        messages = [{"role": "system", "content": SPEECH_SYSTEM_PROMPT}, {"role": "user", "content": words}]
        ids = chat_prompt(self.engine.tokenizer, messages)
        return user_words(ids, turn_marks(self.engine.tokenizer).end_of_turn_id)

    @torch.inference_mode()
    def log_probs(self, texts: list[str]) -> torch.Tensor:
        """[len(texts), V] log P(next id | prompt of each text); texts that share a prefix of ids with the
        last one given share one forward."""
        out: list[torch.Tensor | None] = [None] * len(texts)
        prompts = [self.prompt(text) for text in texts]
        longest = max(prompts, key=len)
        inside = [i for i, p in enumerate(prompts) if longest[: len(p)] == p]
        first = min(len(prompts[i]) for i in inside) - 1  # the earliest position whose logits we need
        start = min(first, shared_prefix_length(self.cached, longest))
        logits = self.state.feed(longest[start:], start, len(longest) - first)  # [len - first, V]
        assert logits is not None
        self.cached = longest
        rows = logits.float().log_softmax(dim=-1)
        for i in inside:
            out[i] = rows[len(prompts[i]) - 1 - first]
        for i, prompt in enumerate(prompts):
            if out[i] is None:  # not a prefix of the longest in ids: its own forward
                start = min(len(prompt) - 1, shared_prefix_length(self.cached, prompt))
                single = self.state.feed(prompt[start:], start, "last")
                assert single is not None
                self.cached = prompt
                out[i] = single[0].float().log_softmax(dim=-1)
        return torch.stack([row for row in out if row is not None])


def pick_ids(scorer: Scorer, utterances: list[str], protected: list[int]) -> list[int]:
    """The N_IDS ids with the most mean probability after the sample's prefixes, `protected` first."""
    total: torch.Tensor | None = None
    for text in utterances:
        rows = scorer.log_probs([p for p, _ in prefixes(text)]).exp().sum(dim=0)
        total = rows if total is None else total + rows
    assert total is not None
    ranked = [int(i) for i in total.argsort(descending=True) if int(i) not in protected]
    return protected + ranked[: N_IDS - len(protected)]


def features(
    scorer: Scorer, utterances: list[str], ids: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """X [n, K + 1] (the ids' log-probs, then the raw score's logit), y [n], group [n] (the utterance)."""
    marks = turn_marks(scorer.engine.tokenizer)
    index = torch.tensor(ids)
    xs, ys, groups = [], [], []
    started = time.monotonic()
    for n, text in enumerate(utterances):
        for spelling in spellings(text):
            items = prefixes(spelling)
            rows = scorer.log_probs([p for p, _ in items])
            for row, (_, label) in zip(rows, items, strict=True):
                xs.append(
                    np.append(row[index].clamp_min(LOG_FLOOR).numpy(), logit(raw_score(row.exp(), marks)))
                )
                ys.append(label)
                groups.append(n)
        if (n + 1) % 100 == 0:
            rate = (n + 1) / (time.monotonic() - started)
            print(
                f"features: {n + 1}/{len(utterances)} utterances ({rate:.1f}/s)", file=sys.stderr, flush=True
            )
    return np.array(xs, dtype=np.float32), np.array(ys), np.array(groups)


def fit(x: np.ndarray, y: np.ndarray, l2: float) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """Logistic regression on standardised features, classes weighted equally: (w, b, mean, std)."""
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-3
    xt = torch.from_numpy((x - mean) / std).double()
    yt = torch.from_numpy(y).double()
    weight = torch.where(yt > 0, 0.5 / yt.mean(), 0.5 / (1 - yt.mean()))
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = (
            weight * torch.nn.functional.binary_cross_entropy_with_logits(xt @ w + b, yt, reduction="none")
        ).mean()
        loss = loss + l2 * (w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach().numpy(), float(b.detach()), mean, std


def predict(x: np.ndarray, w: np.ndarray, b: float, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(((x - mean) / std) @ w + b)))


def figures(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    done, cut = p[y == 1], p[y == 0]
    top5 = np.sort(cut)[::-1][int(0.05 * cut.size)]
    return {
        "auc": round(auc(done, cut), 4),
        "finished_above_95pct_unfinished": round(float((done > top5).mean()), 3),
        "finished_at_0.4": round(float((done >= 0.4).mean()), 3),
        "unfinished_at_0.4": round(float((cut >= 0.4).mean()), 3),
    }


@on_engine_thread  # every forward and kernel call on one thread (engine/engine_thread.py)
def main() -> None:
    from voiceagent.config import Settings
    from voiceagent.llm import load_local_engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("draft", "target"), default="draft")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--limit", type=int, default=0, help="use the first N utterances only (0: all)")
    args = parser.parse_args()
    settings = Settings()
    engine = load_local_engine(settings)
    name = settings.draft if args.model == "draft" else settings.target
    utterances = [line.strip() for line in args.corpus.read_text().splitlines() if line.strip()]
    random.Random(0).shuffle(utterances)
    if args.limit:
        utterances = utterances[: args.limit]
    scorer = Scorer.create(engine, args.model)
    marks = turn_marks(engine.tokenizer)
    protected = [marks.end_of_turn_id, *(i for group in marks.mark_ids for i in group)]
    ids = pick_ids(scorer, utterances[:SAMPLE_FOR_IDS], protected)
    print(f"picked {len(ids)} ids on {SAMPLE_FOR_IDS} utterances", file=sys.stderr, flush=True)
    x, y, groups = features(scorer, utterances, ids)
    held = groups % 5 == 0
    raw = 1.0 / (1.0 + np.exp(-x[held, -1]))
    print(f"raw score, held out ({held.sum()} prefixes): {figures(raw, y[held])}", file=sys.stderr)
    best = None
    for l2 in L2_GRID:
        p = predict(x[held], *fit(x[~held], y[~held], l2))
        result = figures(p, y[held])
        print(f"head l2={l2}, held out: {result}", file=sys.stderr, flush=True)
        if best is None or result["auc"] > best[1]["auc"]:
            best = (l2, result)
    assert best is not None
    w, b, mean, std = fit(x, y, best[0])
    head = TurnHead.from_standardised(
        ids, w, b, mean, std, model=name, l2=best[0], n_utterances=len(utterances)
    )
    path = HEADS / f"{name}.json"
    head.save(path)
    print(json.dumps({"model": name, "l2": best[0], "held_out": best[1], "path": str(path)}))


if __name__ == "__main__":
    main()
