"""The engine's own CPU kernels: GGUF K-quant matrices times int8 activations, flat in the number of rows
(gguf_mm.cpp), and attention over the KV cache row by row, so that a verify's rows equal decoding's bit for
bit (attention.cpp); a whole decoder layer in one call, for forwards of a few ids (layer.cpp).

`gguf_mm()` builds them once for this CPU (torch's C++ extension loader, ~1 min on
2 cores, with -march=native: AVX-512 VNNI, AVX-VNNI or AVX2 as the CPU has) into
`$VOICEAGENT_CACHE/kernels/<key>`, the key made of the source, torch's version and the CPU's flags, so a
cache shared by two kinds of CPU never hands one the other's build. `VOICEAGENT_CPU_KERNELS=avx2` (or
`scalar`) makes the engine run an older CPU's build on this one, e.g. to time the AVX2 code paths an
AVX2-only EPYC runs on a machine that has AVX-512 (bench/results/2026-12-06-cpu-xeon-avx2-proxy.md).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType

KERNEL_FILES = ("gguf_mm.cpp", "group32.cpp", "attention.cpp", "layer.cpp")
SOURCES = [Path(__file__).with_name(name) for name in KERNEL_FILES]
HEADERS = [Path(__file__).with_name("simd.h")]
FLAGS = ["-O3", "-march=native", "-fopenmp"]
# Builds for an older CPU's instructions on this one, so that every code path is tested where it can run:
# "avx2" is what an AMD EPYC with AVX2 only (no AVX-512, no VNNI) runs; "scalar" any CPU's fallback.
VARIANTS = {
    "native": FLAGS,
    "avx2": [*FLAGS, "-mno-avx512f", "-mno-avxvnni"],
    "scalar": ["-O3", "-fopenmp"],  # x86-64's baseline: SSE2 only
}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_key(flags: list[str]) -> str:
    import torch

    sources = [path.read_text() for path in (*SOURCES, *HEADERS)]
    text = "\n".join([*sources, torch.__version__, " ".join(flags), _cpu_flags()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def gguf_mm(variant: str | None = None) -> ModuleType:
    """The compiled kernel module (built on first use, then loaded from the cache); `variant` "avx2" or
    "scalar" builds the code paths of older CPUs (for tests); None: `$VOICEAGENT_CPU_KERNELS` or "native".
    Forwards call this for every projection and attention: both lookups are cached."""
    return _built(variant or _variant_from_environment())


@cache
def _variant_from_environment() -> str:
    """`$VOICEAGENT_CPU_KERNELS` or "native", read once (an unknown name is refused each time it is asked)."""
    chosen = os.environ.get("VOICEAGENT_CPU_KERNELS") or "native"
    if chosen not in VARIANTS:
        raise ValueError(f"VOICEAGENT_CPU_KERNELS={chosen!r}: expected one of {', '.join(VARIANTS)}")
    return chosen


@cache
def _built(variant: str) -> ModuleType:
    from torch.utils import cpp_extension

    from engine.models import cache_root

    flags = VARIANTS[variant]
    name = "gguf_mm" if variant == "native" else f"gguf_mm_{variant}"
    directory = cache_root() / "kernels" / f"{name}-{build_key(flags)}"
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.glob("*.so")):
        print(
            f"engine: building the CPU kernels ({variant}) for this CPU into {directory} (~1 min, once)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return cpp_extension.load(
            name=name,
            sources=[str(s) for s in SOURCES],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    except (RuntimeError, OSError) as error:
        raise RuntimeError(
            f"could not build the CPU kernels in {SOURCES[0].parent} ({error}); they need g++ and ninja "
            "(`make setup` installs both), or load the model with the ggml backend"
        ) from error


def kernels_build(log: Callable[[str], None]) -> bool:
    """Whether the kernels build (or are built) here; if not, says why and that llama.cpp's kernels run
    instead, so a machine without a compiler still serves (on the ggml backend's speed)."""
    try:
        gguf_mm()
    except RuntimeError as error:
        log(
            f"native: the engine's CPU kernels did not build ({str(error).splitlines()[0]}); "
            "both models run on llama.cpp's kernels"
        )
        return False
    return True
