"""The CPU backend on ggml: a GGUF model run by llama.cpp's kernels, under the engine's own speculation.

On a CPU the forward pass is bound by reading 4-bit weights, and llama.cpp's kernels (Q4_K/Q6_K dot
products on int8 activations, AVX2 or AVX-512 chosen where it is built) read them several times faster than
any PyTorch path measured here (bench/results/2026-12-01-cpu-int4-profile.md). So on the CPU the engine may
run the very GGUF file llama.cpp runs, through llama-cpp-python's low-level API, while drafting, verifying,
rolling back and committing stay the engine's: `GgmlModel` is called exactly like `Transformer`.

Shapes: T = ids in a forward, V = vocabulary. A `GgmlCache` is one llama.cpp context (its own KV cells) per
conversation and model; its cells hold positions, so "attend the first kv_len positions" is "drop every cell
at or after the forward's first position, then decode": a rejected draft is forgotten the same way.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from engine.model import LogitsMode

MAX_BATCH = 512  # ids per forward (the engine's prefill chunk); llama.cpp splits them into UBATCH-sized runs
UBATCH = 128  # bounds llama.cpp's compute buffers; a verify of a few ids or a 64-id prefill fits in one
ERROR_LEVEL = 4  # GGML_LOG_LEVEL_ERROR: what llama.cpp prints of its own
AMX_BUILT = "AMX_INT8 = 1"  # in llama_print_system_info() of a build with ggml's AMX backend


def _llama() -> Any:
    try:
        import llama_cpp
    except ImportError as error:
        raise ImportError(
            "the ggml backend needs llama-cpp-python: `make setup` builds it (pip install "
            "llama-cpp-python==0.3.36, ~10 min from source on 2 cores), or use --backend torch"
        ) from error
    return llama_cpp


@functools.cache
def _backend() -> Any:
    """llama.cpp, initialised once per process, printing only its errors."""
    lib = _llama()
    lib.llama_backend_init()

    @lib.llama_log_callback
    def log(level: int, text: bytes, _user: object) -> None:
        if level == ERROR_LEVEL:
            sys.stderr.write(text.decode(errors="replace"))

    lib.llama_log_set(log, ctypes.c_void_p(0))
    _backend.log = log  # type: ignore[attr-defined]  # keep the callback alive
    return lib


def available() -> bool:
    """True when llama-cpp-python is installed."""
    try:
        _llama()
    except ImportError:
        return False
    return True


def extra_buffers_safe(system_info: str) -> bool:
    """Whether llama.cpp may put weights in its extra buffer types (repacked for its multi-row kernels).

    Not in a build with the AMX backend (`system_info` says AMX_INT8 = 1): AMX is the first extra buffer
    type, it takes the Q4_K and Q6_K weights, and its matmul crashes on a forward of more than one id
    (a segfault on the Intel Xeon with AMX here, 2026-12-02; llama.cpp issue 20824). Such a build then runs
    on the plain CPU buffers, ~2.3x slower a step (89 against 38 ms for the bundled target) but correct.
    `make setup` builds llama-cpp-python without AMX (scripts/build-llama-cpp.sh), so this is a fallback
    for one installed by hand.
    """
    return AMX_BUILT not in system_info


@functools.cache
def _warn_amx_build() -> None:
    sys.stderr.write(
        "voiceagent: this llama-cpp-python was built with llama.cpp's AMX kernels, which crash on the "
        "bundled 4-bit models, so the ggml backend runs without its repacked weights (~2.3x slower). "
        "Rebuild it without AMX: scripts/build-llama-cpp.sh .venv/bin/python\n"
    )


@dataclass(frozen=True)
class GgmlArgs:
    """What the engine reads of a model's shape."""

    vocab_size: int
    n_layers: int
    dim: int
    context_length: int  # the model's training context


class GgmlModel:
    """A GGUF file under llama.cpp; `model(tokens, input_pos, cache, kv_len, logits)` as `Transformer`."""

    quantization = "gguf"  # the file's own formats (Q4_K_M: Q4_K and Q6_K blocks)
    device = torch.device("cpu")
    dtype = torch.float32  # of the logits it returns

    def __init__(self, path: Path, max_seq_len: int, n_threads: int | None = None) -> None:
        lib = _backend()
        if not Path(path).is_file():
            raise ValueError(f"no GGUF file at {path}")
        params = lib.llama_model_default_params()
        # Read, not mapped (llama-cpp-python 0.3.36 names this load_mode; its params have no use_mmap). The
        # Q4_K tensors are repacked for llama.cpp's multi-row AVX2/AVX-512 kernels (CPU_REPACK) into a buffer
        # of their own, so a mapped file kept their original pages resident too: the bundled pair held
        # 2559 MiB mapped against 1935 MiB read, at the same step time (AMD EPYC AVX2, 2026-12-01).
        params.load_mode = lib.LLAMA_LOAD_MODE_NONE
        if not extra_buffers_safe(lib.llama_print_system_info().decode(errors="replace")):
            params.use_extra_bufts = False
            _warn_amx_build()
        self._lib = lib
        self._model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path}")
        weakref.finalize(self, lib.llama_model_free, self._model)
        vocab = lib.llama_model_get_vocab(self._model)
        self.args = GgmlArgs(
            vocab_size=lib.llama_vocab_n_tokens(vocab),
            n_layers=lib.llama_model_n_layer(self._model),
            dim=lib.llama_model_n_embd(self._model),
            context_length=lib.llama_model_n_ctx_train(self._model),
        )
        self.max_seq_len = min(max_seq_len, self.args.context_length)
        self.n_threads = n_threads or torch.get_num_threads() or os.cpu_count() or 1
        self.path = Path(path)

    def new_cache(self, max_seq_len: int | None = None) -> GgmlCache:
        n = self.max_seq_len if max_seq_len is None else max_seq_len
        if not 2 <= n <= self.max_seq_len:
            raise ValueError(f"a cache holds 2..{self.max_seq_len} positions for this model, got {n}")
        return GgmlCache(self, n)

    def __call__(
        self,
        tokens: Tensor,
        input_pos: Tensor,
        cache: Any,  # a GgmlCache: typed loosely, as Transformer's (nn.Module) call is
        kv_len: int,
        logits: LogitsMode | int = "all",
    ) -> Tensor | None:
        """tokens, input_pos: [T] int64 (consecutive positions) -> logits [T, V], [1, V], [k, V] or None."""
        assert tokens.ndim == 1 and tokens.shape == input_pos.shape, (tokens.shape, input_pos.shape)
        assert isinstance(cache, GgmlCache) and cache.model is self, "a cache made by this model's new_cache"
        n_tokens = tokens.shape[0]
        start = int(input_pos[0])
        assert kv_len == start + n_tokens <= cache.max_seq_len, (kv_len, start, n_tokens)
        n_logits = {"all": n_tokens, "last": 1, "none": 0}[logits] if isinstance(logits, str) else logits
        assert 0 <= n_logits <= n_tokens, (n_logits, n_tokens)
        return cache.forward(tokens.tolist(), start, n_logits)


class GgmlCache:
    """One conversation's llama.cpp context for one model: its KV cells, a batch, its output logits."""

    def __init__(self, model: GgmlModel, max_seq_len: int) -> None:
        lib = model._lib
        params = lib.llama_context_default_params()
        params.n_ctx = max_seq_len
        params.n_batch = MAX_BATCH
        params.n_ubatch = UBATCH
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = model.n_threads
        params.no_perf = True
        self._lib, self.model, self.max_seq_len = lib, model, max_seq_len
        self._ctx = lib.llama_init_from_model(model._model, params)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {max_seq_len} positions")
        self._memory = lib.llama_get_memory(self._ctx)
        self._batch = lib.llama_batch_init(MAX_BATCH, 0, 1)
        weakref.finalize(self, _free_context, lib, self._ctx, self._batch)

    @property
    def nbytes(self) -> int:
        """Bytes of this context's state (the KV cells in use)."""
        return int(self._lib.llama_state_seq_get_size(self._ctx, 0))

    def forward(self, ids: list[int], start: int, n_logits: int) -> Tensor | None:
        """Decodes `ids` at positions start.. after dropping every cell from `start` on; -> [n_logits, V]."""
        lib, batch = self._lib, self._batch
        n_tokens = len(ids)
        assert 0 < n_tokens <= MAX_BATCH, n_tokens
        lib.llama_memory_seq_rm(self._memory, 0, start, -1)
        batch.n_tokens = n_tokens
        first_output = n_tokens - n_logits
        for i, token in enumerate(ids):
            batch.token[i] = token
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_output
        status = lib.llama_decode(self._ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({n_tokens} ids at {start})")
        if n_logits == 0:
            return None
        vocab = self.model.args.vocab_size
        rows = np.ctypeslib.as_array(lib.llama_get_logits(self._ctx), shape=(n_logits, vocab))
        return torch.from_numpy(rows.copy())  # [n_logits, V] fp32: the buffer is reused by the next decode

    def copy_prefix_from(self, other: GgmlCache, n_tokens: int) -> None:
        """Makes this context hold `other`'s first `n_tokens` positions (for `Conversation.fork`)."""
        lib = self._lib
        lib.llama_memory_seq_rm(self._memory, 0, 0, -1)
        if n_tokens == 0:
            return
        size = lib.llama_state_seq_get_size(other._ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        written = lib.llama_state_seq_get_data(other._ctx, buffer, size, 0)
        if not lib.llama_state_seq_set_data(self._ctx, buffer, written, 0):
            raise RuntimeError("llama.cpp could not copy a conversation's cache")
        lib.llama_memory_seq_rm(self._memory, 0, n_tokens, -1)


def _free_context(lib: Any, ctx: object, batch: object) -> None:
    lib.llama_batch_free(batch)
    lib.llama_free(ctx)
