"""The turn-taking clips: generated speech of five classes, each sentence in two voices, tuning apart.

A "|" in a text marks a pause (0.5-1.0 s), made so that the voice keeps its mid-sentence intonation instead
of the falling tone of a phrase spoken on its own: espeak-ng reads the sentence as SSML with a <break> there;
for Piper the whole sentence is synthesised once and digital silence is spliced in at the quietest point
near where the words before the "|" end (found by synthesising them alone). Every clip has 0.5 s of silence
before the speech and `TRAIL_S` after it, enough for the longest wait of either system (Pipecat's 0.2 + 3 s
fallback).

Classes: complete questions and requests; mid-sentence pauses (after a preposition, after "and", inside a
dictated number, after the start of a question, after a verb); lists (a pause after each comma); hesitations
("um" and a pause); backchannels ("mm-hmm", "yeah", "okay", ...), heard while the agent speaks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from voiceagent.audio import SAMPLE_RATE, read_wav, resample, with_noise_floor, write_wav

LEAD_S = 0.5
TRAIL_S = 3.6
PAUSES_S = (0.5, 0.7, 0.9, 1.0)  # cycled over the clips of a class
VOICES = ("piper", "espeak")
LOUD = 300  # |sample| above this (about -40 dBFS) is speech, for the reference end of speech
# Speech a piece between two of Piper's splice points holds at least, else the sentence is drawn again:
# Piper pauses after a comma and draws its durations anew each time, so a prefix's length is only a guess
# at the cut, and two cuts could fall in one comma's pause ("The colours are red, | green, | and blue."
# lost "green," so until 2026-12-06: one pause of 2.2 s instead of two of ~1 s), or a piece hold one sound
# ("I need eggs, | milk," cut inside "eggs": 0.12 s).
MIN_PIECE_SPEECH_S = 0.2
RENDER_ATTEMPTS = 8  # Piper draws its durations anew each time: a failed rendering is drawn again
RENDER_VERSION = 6  # in the clips' key: clips rendered by an older `render` are rendered again

TEXTS: dict[str, dict[str, list[str]]] = {
    "complete": {
        "tune": [
            "What is the capital of France?",
            "How far away is the moon?",
            "Can you set an alarm for seven?",
            "What time does the bank close today?",
            "Tell me a fun fact about octopuses.",
            "How do I boil an egg?",
        ],
        "report": [
            "What's the weather like in Paris today?",
            "How many ounces are in a pound?",
            "Who wrote Pride and Prejudice?",
            "Can you recommend a good book?",
            "What is the tallest mountain in the world?",
            "Play some relaxing music.",
            "How long should I bake a potato?",
            "Is it going to rain tomorrow?",
        ],
    },
    "pause": {
        "tune": [
            "I'd like to book a table for | four people on Friday.",
            "Send a message to | my brother about dinner.",
            "I need to buy bread and | some fresh tomatoes.",
            "Turn off the lights and | lock the front door.",
            "My phone number is five five five | two three four one.",
            "The code is four seven | nine two.",
            "Can you tell me | how to get to the station?",
            "What is | the best way to learn French?",
        ],
        "report": [
            "Remind me to pick up the kids from | school at three.",
            "Put the meeting on | Thursday afternoon.",
            "Could you remind me to call | my sister after lunch?",
            "I want a coffee and | a blueberry muffin.",
            "Email the report to Anna and | copy in David.",
            "My account number is three one eight | five five zero.",
            "Call me back on zero seven | nine one two.",
            "Do you know | when the pharmacy opens?",
            "How do I | change a flat tyre?",
        ],
    },
    "list": {
        "tune": ["I need eggs, | milk, | and butter.", "Add apples, | bananas, | and grapes to my list."],
        "report": [
            "Pack a toothbrush, | a towel, | and some sunscreen.",
            "The colours are red, | green, | and blue.",
            "Invite Tom, | Sarah, | and Mike to the party.",
        ],
    },
    "hesitation": {
        "tune": ["I want to, um, | book a flight to Rome.", "Can you, um, | find me a recipe for soup?"],
        "report": [
            "I'd like to, um, | order a large pizza.",
            "What was, um, | the score of the game last night?",
            "Could you, um, | turn the volume down?",
        ],
    },
    "backchannel": {"tune": [], "report": ["Mm-hmm.", "Yeah.", "Okay.", "Uh-huh.", "Right."]},
}


@dataclass(frozen=True)
class Clip:
    """One generated utterance; times in seconds from the clip's start."""

    name: str
    kind: str  # a key of TEXTS
    subset: str  # "tune" or "report"
    voice: str
    text: str  # without the "|" marks
    pauses: tuple[tuple[float, float], ...]  # spliced-in silences (start, end)
    speech_end_s: float  # the last loud sample: the reference end of speech
    path: str  # the 16 kHz PCM16 wav

    def audio(self) -> np.ndarray:
        return read_wav(self.path)


Synthesize = Callable[[str], np.ndarray]  # text -> [n] int16 at 16 kHz


def piper() -> Synthesize:
    """The bundled Piper voice as text -> 16 kHz PCM16 (each call draws its durations anew)."""
    from voiceagent.tts import load_synthesizer

    synthesizer = load_synthesizer("piper")

    def speak(text: str) -> np.ndarray:
        chunks = list(synthesizer.synthesize(text))
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        return resample(audio, synthesizer.sample_rate, SAMPLE_RATE)

    return speak


def espeak_with_breaks(text: str, pauses_s: list[float], directory: Path) -> np.ndarray:
    """espeak-ng (en-us, 160 wpm) reading `text` as SSML, a <break> of pauses_s[i] at the i-th "|"."""
    parts = [p.strip() for p in text.split("|")]
    breaks = [f'<break time="{round(p * 1000)}ms"/>' for p in pauses_s]
    ssml = parts[0] + "".join(f" {b} {w}" for b, w in zip(breaks, parts[1:], strict=True))
    path = directory / "espeak-scratch.wav"
    command = ["espeak-ng", "-m", "-v", "en-us", "-s", "160", "-w", str(path), f"<speak>{ssml}</speak>"]
    subprocess.run(command, check=True, capture_output=True)
    return read_wav(path)


def _silent_runs(audio: np.ndarray, n: int) -> list[tuple[float, float]]:
    """The `n` longest runs of quiet samples inside the speech, in order: (start s, end s)."""
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > LOUD)
    gaps = np.flatnonzero(np.diff(loud) > 1)
    runs = sorted(((loud[g] + 1, loud[g + 1]) for g in gaps), key=lambda r: r[0] - r[1])[:n]
    return [(float(a) / SAMPLE_RATE, float(b) / SAMPLE_RATE) for a, b in sorted(runs)]


def _trim(audio: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > LOUD)
    return audio[loud[0] : loud[-1] + 1] if loud.size else audio[:0]


def _splice_point(whole: np.ndarray, expected: int) -> int:
    """The quietest 20 ms of `whole` from 250 ms before to 100 ms after sample `expected`."""
    window = 320
    lo, hi = max(window, expected - 4000), min(len(whole) - window, expected + 1600)
    if hi <= lo:
        return min(max(expected, 0), len(whole))
    energy = np.convolve(whole.astype(np.float64) ** 2, np.ones(window), mode="same")
    return int(lo + np.argmin(energy[lo:hi]))


def _speech_s(audio: np.ndarray) -> float:
    """How long `audio` is loud (|sample| > LOUD), from its first loud sample to its last."""
    return max(0, len(_trim(audio)) - 1) / SAMPLE_RATE


class PieceWithoutSpeech(RuntimeError):
    """`render` cut a sentence where a piece between two pauses is (nearly) silent."""


def render_piper(
    text: str, speak: Synthesize, pauses_s: list[float]
) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """`render` drawn again (up to RENDER_ATTEMPTS times) until every piece holds speech."""
    for _ in range(RENDER_ATTEMPTS - 1):
        with contextlib.suppress(PieceWithoutSpeech):
            return render(text, speak, pauses_s)
    return render(text, speak, pauses_s)


def render(
    text: str, speak: Synthesize, pauses_s: list[float]
) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """The sentence with a pause at each "|" -> (audio [n] int16, pause intervals in the audio)."""
    parts = [p.strip() for p in text.split("|")]
    whole = _trim(speak(" ".join(parts)))
    cuts: list[int] = []
    for i in range(1, len(parts)):
        before = _trim(speak(" ".join(parts[:i])))
        expected = len(before) - int(0.06 * SAMPLE_RATE)  # a phrase-final syllable is drawn out
        cuts.append(_splice_point(whole, max(expected, cuts[-1] + 1 if cuts else 1)))
    for start, end in zip([0, *cuts], [*cuts, len(whole)], strict=True):
        if _speech_s(whole[start:end]) < MIN_PIECE_SPEECH_S:
            raise PieceWithoutSpeech(f"rendering {text!r}: a piece between two pauses holds no speech")
    pieces, pauses, at, previous = [np.zeros(int(LEAD_S * SAMPLE_RATE), np.int16)], [], LEAD_S, 0
    for cut, pause in zip(cuts, pauses_s, strict=False):
        pieces.append(whole[previous:cut])
        at += (cut - previous) / SAMPLE_RATE
        pieces.append(np.zeros(int(pause * SAMPLE_RATE), np.int16))
        pauses.append((at, at + pause))
        at, previous = at + pause, cut
    pieces += [whole[previous:], np.zeros(int(TRAIL_S * SAMPLE_RATE), np.int16)]
    return np.concatenate(pieces), pauses


def build_clips(directory: Path, log: Callable[[str], None]) -> list[Clip]:
    """Every clip of TEXTS in every voice, rendered once into `directory` (a manifest keeps them)."""
    identity = [TEXTS, PAUSES_S, VOICES, LEAD_S, TRAIL_S, RENDER_VERSION]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:12]
    manifest = directory / f"clips-{key}.json"
    if manifest.exists():
        kept = json.loads(manifest.read_text())
        return [Clip(**{**c, "pauses": tuple(map(tuple, c["pauses"]))}) for c in kept]
    directory.mkdir(parents=True, exist_ok=True)
    speak_piper, clips = piper(), []
    for kind, subsets in TEXTS.items():
        for subset, texts in subsets.items():
            for i, text in enumerate(texts):
                for voice in VOICES:
                    n_pauses = text.count("|")
                    pauses_s = [PAUSES_S[(i + j + len(voice)) % len(PAUSES_S)] for j in range(n_pauses)]
                    if voice == "piper":
                        audio, pauses = render_piper(text, speak_piper, pauses_s)
                    else:
                        audio = espeak_with_breaks(text, pauses_s, directory)
                        audio = np.concatenate([np.zeros(int(LEAD_S * SAMPLE_RATE), np.int16), _trim(audio),
                                                np.zeros(int(TRAIL_S * SAMPLE_RATE), np.int16)])  # fmt: skip
                        pauses = _silent_runs(audio, n_pauses)
                    name = f"{kind}-{subset}-{i:02d}-{voice}"
                    path = directory / f"{name}-{key}.wav"
                    write_wav(path, audio, SAMPLE_RATE)
                    loud = np.flatnonzero(np.abs(audio.astype(np.int32)) > LOUD)
                    end_s = float(loud[-1] + 1) / SAMPLE_RATE if loud.size else LEAD_S
                    clean = " ".join(p.strip() for p in text.split("|"))
                    clips.append(Clip(name, kind, subset, voice, clean, tuple(pauses), end_s, str(path)))
        log(f"turn-taking clips: {kind} rendered")
    manifest.write_text(json.dumps([asdict(c) for c in clips], indent=1))
    return clips


def with_noise(clips: list[Clip], dbfs: float, directory: Path) -> list[Clip]:
    """Copies of `clips` with pink noise (`voiceagent.audio.pink_noise`) at `dbfs` RMS under the whole
    clip (seeded by the clip's name), as any microphone or phone line has: generated speech otherwise ends in
    digital silence, where Silero drops at once. Written once beside the clean ones; the reference end of
    speech stays the clean one's."""
    noisy = []
    for clip in clips:
        path = directory / f"{Path(clip.path).stem}-noise{abs(dbfs):g}.wav"
        if not path.exists():
            seed = int(hashlib.sha256(clip.name.encode()).hexdigest()[:8], 16)
            write_wav(path, with_noise_floor(read_wav(clip.path), dbfs, seed), SAMPLE_RATE)
        noisy.append(Clip(**{**asdict(clip), "path": str(path)}))
    return noisy
