"""The GGUF file a bundled draft runs from on the ggml backend: its own file requantized once (to Q4_0).

Qwen2.5-0.5B's matrices are 896 values wide, not a multiple of the 256-value blocks of the K-quants, so
its Q4_K_M file holds most of them in Q5_0 (the rest Q8_0 and Q6_K). llama.cpp's CPU backend has no
repacked multi-row kernel for Q5_0, so every id of a forward is another pass over those weights: on an AMD
EPYC (AVX2, 2 threads) a forward of 1 / 2 / 3 / 8 ids cost 47 / 82 / 109-124 / 176-380 ms. Requantized to
Q4_0, which that backend repacks (blocks of 32: any width), the same forwards cost 34 / 41 / 55 / 95-103 ms
(`python -m engine.bench.ggml_rows --target <file>`; bench/results/2026-12-01-cpu-ggml-draft.md).
Those 2-3 id forwards are what the end-of-turn score (engine/turn_end.py) and a draft catching up cost.

A draft only proposes: the target verifies every token, so the output is the target's whatever the
draft's weights. Only the role of draft gets this file, and only a bundled model that names a type
(`BundledModel.ggml_draft_type`; SmolLM2's Q4_1 drafts as it is); the same model named as a target runs
from its own file. A .gguf file given by path runs as it is.

The file is made next to the checked source (`<source stem>-draft-<type>.gguf`, a few seconds) with a
sidecar recording the source's sha256, the type and llama.cpp's version; a later load trusts it when the
sidecar and the file's size still match.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

from engine.bundled import BUNDLED
from engine.models import Log, log_to_stderr, resolve_gguf

__all__ = ["ggml_draft_gguf", "requantize"]

_FTYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def ggml_draft_gguf(name_or_path: str, log: Log = log_to_stderr) -> Path:
    """A bundled model's name -> the file it drafts from: requantized once to its `ggml_draft_type`, or its
    own where it has none; a .gguf path -> itself."""
    source = resolve_gguf(name_or_path, log=log)
    model = BUNDLED.get(name_or_path)
    if model is None or model.ggml_draft_type is None:
        return source
    gguf_type = model.ggml_draft_type
    dest = source.with_name(f"{source.stem}-draft-{gguf_type}.gguf")
    stamp = _stamp(model.sha256, gguf_type)
    if not _derived_ok(dest, stamp):
        log(f"requantizing the draft {name_or_path} to {gguf_type} for llama.cpp's kernels (once)")
        requantize(source, dest, gguf_type)
        _sidecar(dest).write_text(json.dumps({**stamp, "size": dest.stat().st_size}) + "\n")
    return dest


def requantize(source: Path, dest: Path, gguf_type: str) -> None:
    """Writes `source`'s tensors as `gguf_type` into `dest` (llama.cpp's quantizer, every core)."""
    from engine.ggml import _backend

    if gguf_type not in _FTYPES:
        raise ValueError(f"unknown GGUF type {gguf_type!r}; choose one of {', '.join(_FTYPES)}")
    lib = _backend()
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, _FTYPES[gguf_type])
    params.allow_requantize = True  # the source is quantized already
    params.nthread = os.cpu_count() or 1
    tmp = dest.with_name(f".{dest.name}.tmp")
    failed = lib.llama_model_quantize(str(source).encode(), str(tmp).encode(), ctypes.byref(params))
    if failed:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(
            f"llama.cpp could not requantize {source} to {gguf_type} (error {failed}); check the disk "
            f"space in {dest.parent}, or delete {source} so that it is assembled again"
        )
    os.replace(tmp, dest)


def _stamp(source_sha256: str, gguf_type: str) -> dict[str, str]:
    from engine.ggml import _llama

    return {
        "source_sha256": source_sha256,
        "type": gguf_type,
        "llama_cpp": str(getattr(_llama(), "__version__", "?")),
    }


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _derived_ok(path: Path, stamp: dict[str, str]) -> bool:
    try:
        recorded = json.loads(_sidecar(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        path.is_file()
        and isinstance(recorded, dict)
        and recorded.get("size") == path.stat().st_size
        and all(recorded.get(key) == value for key, value in stamp.items())
    )
