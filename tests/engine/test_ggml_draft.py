"""The draft's own GGUF for the ggml backend (engine/ggml_draft.py): made once, checked, and never a change
to the output (the target decides every token, whatever the draft's weights)."""

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType, GGUFReader

from engine.bundled import BUNDLED
from engine.ggml import GgmlModel
from engine.ggml_draft import _derived_ok, _stamp, ggml_draft_gguf, requantize
from engine.load import load_engine
from engine.models import resolve_gguf
from tests.support.bundled import DRAFT, TARGET, TINY, greedy_ids, question

pytestmark = pytest.mark.bundled

Q4_0 = GGMLQuantizationType.Q4_0
DRAFT_GGUF_TYPE = "q4_0"  # the bundled draft's BundledModel.ggml_draft_type


def matrix_types(path: Path) -> dict[str, GGMLQuantizationType]:
    """The GGUF types of a file's matrices, by tensor name."""
    return {t.name: t.tensor_type for t in GGUFReader(path).tensors if len(t.shape) == 2}


def test_the_bundled_draft_runs_from_its_q4_0_file_and_the_target_from_its_own() -> None:
    assert BUNDLED[DRAFT].ggml_draft_type == DRAFT_GGUF_TYPE
    path = ggml_draft_gguf(DRAFT)
    assert path != resolve_gguf(DRAFT) and path.name.endswith(f"-draft-{DRAFT_GGUF_TYPE}.gguf")
    # Every matrix but the output head (llama.cpp keeps that one at its own type) is Q4_0.
    kinds = matrix_types(path)
    assert {t for name, t in kinds.items() if name != "output.weight"} == {Q4_0}
    assert ggml_draft_gguf(DRAFT) == path  # made once: the second call finds it
    assert ggml_draft_gguf(str(resolve_gguf(TARGET))) == resolve_gguf(TARGET)  # a path runs as it is
    assert ggml_draft_gguf(TINY) == resolve_gguf(TINY)  # a bundled model that names no type, too


def test_a_stale_or_damaged_draft_file_is_not_trusted(tmp_path: Path) -> None:
    stamp = _stamp(BUNDLED[DRAFT].sha256, DRAFT_GGUF_TYPE)
    made = tmp_path / "draft.gguf"
    made.write_bytes(b"x" * 100)
    sidecar = tmp_path / "draft.gguf.json"
    sidecar.write_text(json.dumps({**stamp, "size": 100}))
    assert _derived_ok(made, stamp)
    made.write_bytes(b"x" * 99)  # cut short
    assert not _derived_ok(made, stamp)
    sidecar.write_text(json.dumps({**stamp, "size": 99, "source_sha256": "0" * 64}))  # another source
    assert not _derived_ok(made, stamp)
    sidecar.write_text("not json")
    assert not _derived_ok(made, stamp)


def test_a_requantized_draft_leaves_the_output_the_targets(tmp_path: Path) -> None:
    """SmolLM2 (Q4_1) drafting for itself from a Q4_0 copy: the drafts now differ from the target's own
    picks at times, and the speculative output is still the plain output, token for token."""
    draft_file = tmp_path / "tiny-q4_0.gguf"
    requantize(resolve_gguf(TINY), draft_file, DRAFT_GGUF_TYPE)
    assert Q4_0 in matrix_types(draft_file).values()
    assert GgmlModel(draft_file, 256).args.vocab_size == GgmlModel(resolve_gguf(TINY), 256).args.vocab_size
    engine = load_engine(TINY, TINY, backend="ggml", max_seq_len=512, gamma=4)
    engine.draft = GgmlModel(draft_file, 512)
    for text in ("Why do onions make people cry?", "What's a good name for a black cat?"):
        prompt = question(engine, text)
        assert greedy_ids(engine, prompt, 4, 32) == greedy_ids(engine, prompt, 0, 32)


def test_requantize_refuses_an_unknown_type(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown GGUF type"):
        requantize(resolve_gguf(TINY), tmp_path / "x.gguf", "q3_weird")
