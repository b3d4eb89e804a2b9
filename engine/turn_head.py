"""A trained end-of-turn head: P(the user's message is complete) from a model's next-token log-probabilities.

The raw score (engine/turn_end.py) asks the chat model itself whether the message ends here; a model that
expects more words ("Can you recommend a good book" -> "... for beginners") gives a finished question
0.005. The head is a logistic classifier trained on what people say to a voice assistant
(bench/turn_taking/train_head.py, on bench/turn_taking/turn_corpus.txt): from the log-probabilities of K
ids after the words (the ids the model spreads its mass over at such places: "?", "for", "the", "and",
the end-of-turn id) and the raw score's logit, it says where utterances end. Its weights are folded over
the standardisation, so scoring is one gather and one dot product over K + 1 numbers (~15 us here):

    P(complete) = sigmoid(w . [log P(ids | words), logit(raw score)] + b)

A head belongs to one model (engine/turn_heads/<bundled name>.json; `for_model`), whatever backend or
quantisation runs it: it was trained on the native backend's logits, and the tests score it on the ggml
backend's. The raw score is still computed (the head's last feature).

Shapes: V = vocabulary, K = the head's ids.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from engine.turn_end import TurnMarks

__all__ = ["HEADS", "LOG_FLOOR", "TurnHead", "for_model", "logit", "raw_score"]

HEADS = Path(__file__).parent / "turn_heads"
_EDGE = 1e-6  # probabilities are kept this far from 0 and 1 before taking logits
LOG_FLOOR = -70.0  # log-probabilities below this (an id a subset head leaves out: -inf) count as this


def raw_score(probs: Tensor, marks: TurnMarks) -> float:
    """probs [V] after the words -> P(end of turn) + P(a final mark): the raw score (turn_end's a = 0)."""
    score = float(probs[marks.end_of_turn_id])
    for group in marks.mark_ids:
        score += float(probs[list(group)].sum())
    return min(1.0, score)


def logit(p: float) -> float:
    """log(p / (1 - p)), p kept 1e-6 from 0 and 1."""
    p = min(max(p, _EDGE), 1.0 - _EDGE)
    return math.log(p / (1.0 - p))


@dataclass(frozen=True)
class TurnHead:
    """Logistic weights over the log-probabilities of `ids` and the raw score's logit."""

    model: str  # the bundled model it was trained on
    ids: Tensor  # [K] int64
    weights: Tensor  # [K] float32, over log P(ids)
    raw_weight: float  # over logit(raw score)
    bias: float
    about: dict[str, object]  # how it was trained (corpus size, L2 weight, ...)

    def __post_init__(self) -> None:
        if self.ids.ndim != 1 or self.ids.shape != self.weights.shape:
            raise ValueError(
                "a turn head needs ids and weights of one length, got "
                f"{tuple(self.ids.shape)} and {tuple(self.weights.shape)}"
            )
        if not (
            math.isfinite(self.raw_weight)
            and math.isfinite(self.bias)
            and bool(self.weights.isfinite().all())
        ):
            raise ValueError("a turn head's weights must be finite")

    def probability(self, log_probs: Tensor, raw: float) -> float:
        """log_probs [V] (fp32, after the words; -inf where a subset head scores no id) and the raw score
        -> P(complete)."""
        if int(self.ids.max()) >= log_probs.shape[-1]:
            raise ValueError(
                f"this turn head scores ids up to {int(self.ids.max())}, the model has {log_probs.shape[-1]}"
            )
        chosen = log_probs[self.ids].clamp_min(LOG_FLOOR)  # [K]
        z = float(chosen @ self.weights) + self.raw_weight * logit(raw) + self.bias
        return 1.0 / (1.0 + math.exp(-max(min(z, 50.0), -50.0)))

    @classmethod
    def from_standardised(
        cls,
        ids: list[int],
        w: np.ndarray,
        b: float,
        mean: np.ndarray,
        std: np.ndarray,
        *,
        model: str,
        **about: object,
    ) -> TurnHead:
        """Folds a classifier over (x - mean) / std (x = [log P(ids), logit(raw)]) into raw weights."""
        folded = w / std
        bias = float(b - (folded * mean).sum())
        return cls(
            model,
            torch.tensor(ids, dtype=torch.int64),
            torch.from_numpy(folded[:-1].astype(np.float32)),
            float(folded[-1]),
            bias,
            dict(about),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "model": self.model,
            "about": self.about,
            "bias": self.bias,
            "raw_weight": self.raw_weight,
            "ids": self.ids.tolist(),
            "weights": [round(float(v), 7) for v in self.weights],
        }
        path.write_text(json.dumps(record) + "\n")

    @classmethod
    def load(cls, path: Path) -> TurnHead:
        try:
            record = json.loads(path.read_text())
            return cls(
                str(record["model"]),
                torch.tensor(record["ids"], dtype=torch.int64),
                torch.tensor(record["weights"], dtype=torch.float32),
                float(record["raw_weight"]),
                float(record["bias"]),
                dict(record.get("about", {})),
            )
        except (OSError, KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"cannot read the turn head {path}: {error}; retrain it with "
                "`python -m bench.turn_taking.train_head`"
            ) from error


@cache
def for_model(name: str | None) -> TurnHead | None:
    """The head trained for the bundled model `name` (engine/turn_heads/<name>.json), or None."""
    if not name or "/" in name or name.endswith(".gguf"):
        return None
    path = HEADS / f"{name}.json"
    return TurnHead.load(path) if path.is_file() else None
