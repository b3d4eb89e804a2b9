"""The engine's own CPU kernel: GGUF K-quant matrices times int8 activations, flat in the number of rows.

`gguf_mm()` builds engine/cpu_kernels/gguf_mm.cpp once for this CPU (torch's C++ extension loader, ~1 min on
2 cores, with -march=native: AVX-512 VNNI, AVX-VNNI or AVX2 as the CPU has) into
`$VOICEAGENT_CACHE/kernels/<key>`, the key made of the source, torch's version and the CPU's flags, so a
cache shared by two kinds of CPU never hands one the other's build.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("gguf_mm.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp"]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_key() -> str:
    import torch

    text = "\n".join([SOURCE.read_text(), torch.__version__, " ".join(FLAGS), _cpu_flags()])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@cache
def gguf_mm() -> ModuleType:
    """The compiled kernel module (built on first use, then loaded from the cache)."""
    from torch.utils import cpp_extension

    from engine.models import cache_root

    directory = cache_root() / "kernels" / f"gguf_mm-{build_key()}"
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.glob("*.so")):
        print(
            f"engine: building the CPU kernel gguf_mm for this CPU into {directory} (~1 min, once)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return cpp_extension.load(
            name="gguf_mm",
            sources=[str(SOURCE)],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    except (RuntimeError, OSError) as error:
        raise RuntimeError(
            f"could not build the CPU kernel {SOURCE.name} ({error}); it needs g++ and ninja "
            "(`make setup` installs both), or load the model with the ggml backend"
        ) from error
