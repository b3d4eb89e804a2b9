"""Pipecat in a virtualenv of its own (never this project's): made on first use, then reused.

Pipecat pins its own onnxruntime, numpy and pydantic ranges, so it lives in
`$VOICEAGENT_CACHE/pipecat-venv` (~/.cache/voiceagent), installed from PyPI. Smart Turn v3.2's ONNX ships
inside the `pipecat-ai` wheel (pipecat/audio/turn/smart_turn/data/), Silero's too: nothing is fetched
from a model hub. The whisper, piper and openai extras are for the voice-to-voice comparison
(bench/voice_vs_pipecat), which points them at this project's local models and llama.cpp server; the
engines under them are pinned to this project's versions, so both sides run the same kernels. Only the
benches make it, never `make test`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from voiceagent.speech_models import cache_root

PIPECAT_REQUIREMENT = "pipecat-ai[silero,whisper,piper,openai]==1.14.0"  # Smart Turn v3 needs no extra
# The engines under Pipecat's Whisper, Piper and VAD services, at the versions this project runs.
ENGINE_PINS = ("faster-whisper==1.2.1", "ctranslate2==4.8.5", "piper-tts==1.8.0", "onnxruntime==1.32.0")
REQUIREMENTS = (PIPECAT_REQUIREMENT, *ENGINE_PINS)
RUNNER = Path(__file__).with_name("pipecat_turns.py")


def pipecat_python(log: Callable[[str], None]) -> Path:
    """The Python of the Pipecat virtualenv, made and installed if it is not yet (idempotent)."""
    venv = cache_root() / "pipecat-venv"
    python = venv / "bin" / "python"
    digest = hashlib.sha256(" ".join(REQUIREMENTS).encode()).hexdigest()[:12]
    marker = venv / f".installed-{digest}"
    if marker.exists() and python.exists():
        return python
    if not python.exists():
        log(f"pipecat: creating the virtualenv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    log(f"pipecat: pip install {' '.join(REQUIREMENTS)} (from PyPI, a minute or two)")
    install = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *REQUIREMENTS]
    if subprocess.run(install, check=False).returncode != 0:
        raise RuntimeError(
            f"could not install {' '.join(REQUIREMENTS)} into {venv}: see pip's output above "
            f"(delete {venv} to start over)"
        )
    marker.touch()
    log("pipecat: installed")
    return python


def run_pipecat(clips: list[dict[str, object]], log: Callable[[str], None]) -> dict[str, dict[str, object]]:
    """Pipecat's turn-taking on `clips` (name, path): per clip its VAD starts, turn end and inferences."""
    python = pipecat_python(log)
    with tempfile.TemporaryDirectory() as scratch:
        listed, out = Path(scratch) / "clips.json", Path(scratch) / "pipecat.json"
        listed.write_text(json.dumps(clips))
        subprocess.run([str(python), str(RUNNER), str(listed), str(out)], check=True)
        results: dict[str, dict[str, object]] = json.loads(out.read_text())
    return results
