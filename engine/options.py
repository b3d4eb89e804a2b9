"""What to load and how: the one set of load-time settings, for `load_engine`, the CLIs and the server."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from engine.bundled import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.quant import QUANT_MODES, QuantMode

BACKENDS = ("torch", "ggml", "native")
NGRAM_DRAFT = "ngram"  # the draft "model" that drafts by prompt lookup (engine/ngram.py)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class EngineOptions:
    """The models of an engine and how to hold them; ValueError for a dtype, quantisation or length the
    engine does not have (a bad `gamma` is refused by the engine itself).

    `target` and `draft` are bundled names, checkpoint directories or .gguf files (`draft` None: plain
    decoding; "ngram": drafts by prompt lookup from the conversation itself, no draft model). `gamma` is
    the number of drafted tokens per block, or "auto" (adaptive). `quant` / `draft_quant` store the
    target's / draft's linear layers as int8 or int4 (CPU) or fp8 (Hopper): a quantised draft never
    changes the output, a quantised target is a different target. "gguf-int4" (CPU, torch backend, a
    bundled name or .gguf file) loads the GGUF's own Q4_K weights as int4 with no second rounding, the
    other matrix types dense in `dtype` (engine/gguf_int4.py): the weights llama.cpp runs.
    `static_shapes` (None: on for CUDA) runs decode steps as fixed-shape forwards, captured as CUDA
    graphs on a GPU.
    `backend` "ggml" runs both models' GGUF files on llama.cpp's CPU kernels (engine/ggml.py); dtype and
    quantisation are then the files' own. `backend` "native" runs both models' GGUF blocks as they are on
    the engine's own CPU kernels (quant "gguf-a8", engine/cpu_kernels: a forward of a few ids costs about
    one of one id) with fp32 activations, the draft's head over its most frequent ids; a file the kernels
    cannot hold, or a machine where they do not build, runs on llama.cpp's kernels instead.
    """

    target: str
    draft: str | None = None
    dtype: str = "bf16"
    device: str = "cpu"
    max_seq_len: int = 4096  # the KV cache's length in tokens, prompt and reply together
    gamma: int | str = 4
    quant: QuantMode = "none"
    draft_quant: QuantMode = "none"
    static_shapes: bool | None = None
    backend: str = "torch"

    def __post_init__(self) -> None:
        parse_dtype(self.dtype)
        for mode in (self.quant, self.draft_quant):
            if mode not in QUANT_MODES:
                raise ValueError(f"unknown quantisation {mode!r}; choose one of {', '.join(QUANT_MODES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.backend != "torch" and (self.quant != "none" or self.draft_quant != "none"):
            raise ValueError(
                f"the {self.backend} backend runs the GGUF files' own weights: leave quant at 'none'"
            )
        if self.backend != "torch" and self.device != "cpu":
            raise ValueError(f"the {self.backend} backend runs on the CPU; on a GPU use backend 'torch'")
        if self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")

    @classmethod
    def from_attributes(cls, source: object) -> EngineOptions:
        """The options that `source`'s attributes named as the fields give (the CLI's parsed engine flags,
        the server's `ServeOptions`, voiceagent's `Settings`), the rest at their defaults; a draft named
        "none" means plain decoding."""
        values = {
            field.name: getattr(source, field.name) for field in fields(cls) if hasattr(source, field.name)
        }
        draft = values.get("draft")
        if isinstance(draft, str) and draft.lower() == "none":
            values["draft"] = None
        return cls(**values)


# The bundled pair with the default settings: what the command-line entry points load unless told otherwise.
DEFAULT_OPTIONS = EngineOptions(DEFAULT_TARGET, DEFAULT_DRAFT)
