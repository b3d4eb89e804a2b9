"""The engine's own GGUF reading (engine/gguf_file.py): the same tensors as gguf's reader, without building
the metadata (a Qwen vocabulary took gguf's reader ~5-10 s a file)."""

import numpy as np
import pytest
from gguf import GGUFReader

from engine.gguf_file import read_gguf
from engine.models import resolve_gguf
from tests.support.bundled import TINY

pytestmark = pytest.mark.bundled


def test_the_tensors_and_architecture_are_gguf_s_own() -> None:
    path = resolve_gguf(TINY)
    mine, reference = read_gguf(path), GGUFReader(path)
    assert mine.architecture == str(reference.fields["general.architecture"].contents()) == "llama"
    assert [t.name for t in mine.tensors] == [t.name for t in reference.tensors]
    for ours, theirs in zip(mine.tensors, reference.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type and list(ours.shape) == list(theirs.shape)
        assert ours.data.shape == theirs.data.shape and ours.data.dtype == theirs.data.dtype
        assert ours.data_offset == theirs.data_offset and ours.n_bytes == theirs.n_bytes
        assert np.array_equal(ours.data[:1], theirs.data[:1]) and np.array_equal(
            ours.data[-1:], theirs.data[-1:]
        )


def test_a_file_that_is_not_gguf_gets_a_clear_error(tmp_path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(path)
