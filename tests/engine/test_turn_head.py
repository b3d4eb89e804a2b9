"""The trained end-of-turn head: its arithmetic, its file, and (bundled pair) what it reads as finished."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.turn_head import HEADS, LOG_FLOOR, TurnHead, for_model


def _head(raw_weight: float = 1.0, bias: float = 0.0, weights: list[float] | None = None) -> TurnHead:
    ids = torch.tensor([0, 3, 5])
    w = torch.tensor(weights or [0.0, 0.0, 0.0])
    return TurnHead("test", ids, w, raw_weight, bias, {})


def test_a_head_that_weighs_only_the_raw_score_returns_it() -> None:
    log_probs = torch.log_softmax(torch.randn(8), dim=-1)
    for raw in (0.001, 0.3, 0.97):
        assert _head().probability(log_probs, raw) == pytest.approx(raw, rel=1e-6)


def test_the_ids_log_probabilities_move_the_score() -> None:
    log_probs = torch.full((8,), math.log(1 / 8))
    log_probs[3] = math.log(0.5)  # more mass on id 3 than on the rest
    up = _head(weights=[0.0, 2.0, 0.0]).probability(log_probs, 0.5)
    expected = 1 / (1 + math.exp(-2.0 * math.log(0.5)))
    assert up == pytest.approx(expected, rel=1e-6)


def test_an_id_a_subset_head_leaves_out_counts_as_the_floor() -> None:
    log_probs = torch.log_softmax(torch.randn(8), dim=-1)
    log_probs[5] = float("-inf")
    p = _head(weights=[0.0, 0.0, 0.01]).probability(log_probs, 0.5)
    assert p == pytest.approx(1 / (1 + math.exp(-0.01 * LOG_FLOOR)), rel=1e-6)
    assert 0.0 < p < 1.0


def test_the_folded_weights_equal_the_standardised_classifier() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 4)).astype(np.float32)  # 3 ids' log-probs, then logit(raw)
    w, b = rng.normal(size=4), 0.3
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-3
    head = TurnHead.from_standardised([0, 1, 2], w, b, mean, std, model="test")
    for row in x:
        expected = 1 / (1 + math.exp(-(((row - mean) / std) @ w + b)))
        log_probs = torch.tensor([*row[:3], -5.0])
        raw = 1 / (1 + math.exp(-float(row[3])))
        assert head.probability(log_probs, raw) == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_a_head_survives_its_file(tmp_path: Path) -> None:
    head = _head(raw_weight=0.7, bias=-1.5, weights=[0.25, -0.5, 1.0])
    head.save(tmp_path / "h.json")
    again = TurnHead.load(tmp_path / "h.json")
    assert torch.equal(again.ids, head.ids) and torch.allclose(again.weights, head.weights)
    assert (again.raw_weight, again.bias, again.model) == (0.7, -1.5, "test")


def test_a_broken_head_file_says_how_to_remake_it(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"model": "x", "ids": [1, 2], "weights": [0.5]}))
    with pytest.raises(ValueError, match="train_head"):
        TurnHead.load(path)


def test_a_head_refuses_a_smaller_vocabulary() -> None:
    with pytest.raises(ValueError, match="ids up to 5"):
        _head().probability(torch.zeros(4), 0.5)


def test_only_bundled_names_have_heads() -> None:
    assert for_model(None) is None and for_model("/some/dir") is None and for_model("x.gguf") is None
    assert for_model("no-such-model") is None
    for path in HEADS.glob("*.json"):  # every committed head loads and names its model
        head = for_model(path.stem)
        assert head is not None and head.model == path.stem and head.ids.numel() > 100


@pytest.mark.bundled
def test_the_bundled_drafts_head_lifts_finished_questions_and_not_their_first_halves() -> None:
    """On the turn-taking clips' reported questions (never trained on: bench/turn_taking/corpus.py), the
    draft's head scores each finished question above its own first half, and the finished ones higher than
    the model's own score does ("Can you recommend a good book" raw 0.005)."""
    from bench.turn_taking.clips import TEXTS
    from engine.load import chat_prompt, load_engine
    from engine.turn_end import turn_marks, user_words
    from tests.support.bundled import DRAFT, TARGET

    engine = load_engine(TARGET, DRAFT, backend="ggml", max_seq_len=512, gamma=4)
    assert "draft" in engine.turn_heads
    conversation = engine.new_conversation()

    def score(text: str, learned: bool) -> float:
        prompt = chat_prompt(engine.tokenizer, [{"role": "user", "content": text.rstrip("?.")}])
        words = user_words(prompt, turn_marks(engine.tokenizer).end_of_turn_id)
        value = conversation.end_of_turn_probability(words, learned=learned)
        assert value is not None
        return value

    finished = TEXTS["complete"]["report"]
    heads = [score(text, True) for text in finished]
    halves = [score(" ".join(text.split()[: len(text.split()) // 2]), True) for text in finished]
    raws = [score(text, False) for text in finished]
    assert all(h > half for h, half in zip(heads, halves, strict=True)), (heads, halves)
    assert np.median(heads) > np.median(raws) + 0.1, (heads, raws)
