"""Voice activity detection and endpointing on Silero VAD: 20 ms frames in, speech_start/speech_end edges out.

Silero (ONNX, run by onnxruntime) scores 32 ms chunks (512 samples at 16 kHz) with a recurrent state; our
frames are 20 ms (320 samples), so `Endpointer` buffers samples and scores a chunk whenever 512 are there.
Times are therefore exact to a chunk (32 ms): each chunk's start and end are mapped back to the `t_ns` of the
frames it came from.

Decisions (all in `VadOptions`):
- speech_start: chunks at or above `threshold` adding up to `min_speech_ms` (a dip below
  `threshold - hysteresis` before that starts over), with a mean level of at least `min_level_dbfs`. Its
  `t_ns` is the start of the first voiced chunk.
- speech_end: after a chunk below `threshold - hysteresis`, once `end_silence_ms` have passed since the last
  voiced chunk, or since the quiet tail began (`end_from_quiet`, below), up to that chunk's end; checked at
  every frame, so a wait shortened between chunks applies at the next frame. Its `t_ns` is the END of the
  last voiced chunk (Silero's), so `confirmed_ns - t_ns` is the wait (less the quiet tail Silero called
  voiced, when counted from it). `set_end_silence_ms` changes the wait on the fly (the turn-taking policy,
  voiceagent/turn_taking.py, shortens it for a finished sentence and lengthens it for a cut one); it
  applies to the silence under way, so a silence already longer than the new wait ends the speech at the
  next frame.
- The quiet tail: Silero's probability lags the end of a word by ~50-100 ms (its recurrent state), so
  `silence_ms` starts late. `quiet_ms` counts from the end of the last chunk that was also loud: within
  `quiet_margin_db` of the noise floor (a running mean of the silent chunks' level) and at least
  `quiet_min_drop_db` under the utterance's speech level (the mean of its voiced chunks), or
  `quiet_drop_db` under it whatever the noise. The short wait of a finished sentence is counted from it
  (voiceagent/endpointing.py); but speech ends only on a chunk Silero calls silent, since a gap between
  words or a stop consonant's closure inside one is quiet too. Over digital silence both start within a
  chunk of each other; over a noise floor, as on every microphone, the quiet tail starts ~96 ms sooner
  (p50 over the turn-taking clips at -50 dBFS, 32-160 ms); over noise within `quiet_min_drop_db` of the
  speech it never starts, and Silero alone decides.
- Echo guard (`set_guard(True)` while the agent speaks on a phone line, where echo cancellation is not ours):
  a start needs `guard_threshold`, `guard_min_speech_ms` and `guard_min_level_dbfs`. Silero scores speech the
  same at any loudness, so the level tells the agent's own attenuated echo from a user talking over it.

The ONNX model is loaded once per process (`load_silero`) and shared; each `Endpointer` keeps its own
recurrent state, so a new one per session is cheap. Pushing is not thread-safe; scoring a chunk takes ~0.2 ms.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime

from voiceagent.audio import FRAME_SAMPLES, SAMPLE_RATE, to_float
from voiceagent.speech_models import silero_vad_path

__all__ = ["Endpointer", "SileroVad", "VadEdge", "VadOptions", "load_silero"]

CHUNK_SAMPLES = 512  # Silero's window at 16 kHz: 32 ms
CHUNK_MS = CHUNK_SAMPLES * 1000 / SAMPLE_RATE
CONTEXT_SAMPLES = 64  # Silero v5+ sees the previous chunk's last 64 samples before each chunk
NS_PER_SAMPLE = 1_000_000_000 // SAMPLE_RATE  # 62,500


@dataclass(frozen=True)
class VadEdge:
    """A decided edge of the user's speech."""

    kind: Literal["speech_start", "speech_end"]
    t_ns: int  # start: start of the first voiced chunk; end: END of the last voiced chunk
    confirmed_ns: int  # t_ns of the frame whose push decided the edge (end: after the silence wait)


@dataclass(frozen=True)
class VadOptions:
    """Endpointing thresholds. Defaults favour a quick turn: ~0.1 s to start, 0.32 s of silence to end."""

    threshold: float = 0.5  # Silero speech probability that counts a chunk as voiced (its own default)
    hysteresis: float = 0.15  # once speaking, a chunk is silent only below threshold - hysteresis
    min_speech_ms: int = 96  # voiced time before speech_start (3 chunks): a click or a cough is shorter
    end_silence_ms: int = 320  # silence before speech_end: the endpointing latency (10 chunks)
    min_level_dbfs: float = -60.0  # mean level of the voiced start; only rejects near-digital silence
    guard_threshold: float = 0.8  # echo guard: a surer start ...
    guard_min_speech_ms: int = 256  # ... a longer one ...
    guard_min_level_dbfs: float = -40.0  # ... and a louder one (echo returns >= 20 dB below normal speech)
    quiet_drop_db: float = 35.0  # a chunk this far under the utterance's speech level is quiet (quiet_ms) ...
    quiet_margin_db: float = 10.0  # ... as is one within this of the noise floor ...
    quiet_min_drop_db: float = 15.0  # ... if it is at least this far under the speech level
    # speech_end's silence counted from the quiet tail's start, not from the end of Silero's last voiced chunk
    # (the fixed rule's default; `set_end_silence_ms` says it for each wait it sets)
    end_from_quiet: bool = False

    def __post_init__(self) -> None:
        for name in ("threshold", "guard_threshold"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"VadOptions.{name} must be in (0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.hysteresis < self.threshold:
            raise ValueError(f"VadOptions.hysteresis must be in [0, threshold), got {self.hysteresis}")
        if not 0.0 <= self.quiet_min_drop_db <= self.quiet_drop_db or self.quiet_margin_db < 0.0:
            raise ValueError(
                "VadOptions needs 0 <= quiet_min_drop_db <= quiet_drop_db and quiet_margin_db >= 0, got "
                f"{self.quiet_min_drop_db}, {self.quiet_drop_db} and {self.quiet_margin_db}"
            )
        for name in ("min_speech_ms", "end_silence_ms", "guard_min_speech_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"VadOptions.{name} must be >= 0, got {getattr(self, name)}")


class SileroVad:
    """The Silero VAD ONNX model. Stateless itself: the recurrent state is passed in and returned."""

    def __init__(self, path: Path | str | None = None) -> None:
        options = onnxruntime.SessionOptions()
        options.inter_op_num_threads = 1  # one 32 ms chunk is ~0.2 ms: threads only add overhead
        options.intra_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            str(path or silero_vad_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._sample_rate = np.array(SAMPLE_RATE, dtype=np.int64)

    @staticmethod
    def initial_state() -> np.ndarray:
        return np.zeros((2, 1, 128), dtype=np.float32)

    def probability(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """window: [1, 64 + 512] float32 (context + chunk); state: [2, 1, 128] -> (p(speech), new state)."""
        out, new_state = self.session.run(None, {"input": window, "state": state, "sr": self._sample_rate})
        return float(out[0, 0]), new_state


@functools.cache
def load_silero() -> SileroVad:
    """The process's shared Silero model (prepared and loaded on first call; call it to warm up)."""
    return SileroVad()


def _power_dbfs(chunk: np.ndarray) -> float:
    return float(10.0 * np.log10(float(np.mean(chunk.astype(np.float64) ** 2)) + 1e-12))


class Endpointer:
    """Turns a stream of 20 ms frames into speech_start / speech_end edges (see the module docstring)."""

    def __init__(self, options: VadOptions | None = None, model: SileroVad | None = None) -> None:
        self.options = options or VadOptions()
        self._model = model  # None: the shared model, loaded at the first push
        self._guard = False
        self._end_silence_ms = self.options.end_silence_ms
        self._end_from_quiet = self.options.end_from_quiet
        self.reset()

    def reset(self) -> None:
        """Forgets all audio and state (a new stream); the guard and the end-silence wait are kept."""
        self._state = SileroVad.initial_state()
        self._context = np.zeros((1, CONTEXT_SAMPLES), dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._pending_start_ns = 0
        self._speaking = False
        self._last_voiced_end_ns = 0
        self._last_loud_end_ns = 0
        self._scored_until_ns = 0  # the end of the last chunk scored ...
        self._silent_chunk = False  # ... and whether Silero called it silent
        self._noise_db: float | None = None  # running mean level of the silent chunks
        self._speech_power = 0.0  # sum of linear power over the utterance's voiced chunks ...
        self._speech_chunks = 0  # ... and how many
        self._onset_ns: int | None = None
        self._onset_voiced_ns = 0
        self._onset_power = 0.0  # sum of linear power over the onset's voiced chunks
        self._onset_chunks = 0

    def speaking(self) -> bool:
        """True between speech_start and speech_end."""
        return self._speaking

    def silence_ms(self) -> float:
        """While speaking: how long the user has been silent (up to the last scored chunk); else 0.

        A recogniser pass started once this passes ~100 ms hears the whole utterance, so the final
        transcript can reuse it instead of decoding again after speech_end.
        """
        if not self._speaking:
            return 0.0
        gap_ms = (self._pending_start_ns - self._last_voiced_end_ns) / 1e6
        # Silence grows a chunk (32 ms) at a time. Less than half of one is the chunk grid moving to a frame's
        # own stamp (transports stamp frames on arrival), read 0.2-1.2 ms while the user spoke: it held back
        # head starts and regular partials, which wait for no silence.
        return gap_ms if gap_ms >= CHUNK_MS / 2 else 0.0

    def quiet_ms(self) -> float:
        """While speaking: how long the audio has been quiet (see the module docstring), at least
        `silence_ms`; else 0. That the user stopped, ahead of Silero; a gap between words or a closure in
        one reads quiet too."""
        if not self._speaking:
            return 0.0
        gap_ms = (self._pending_start_ns - self._last_loud_end_ns) / 1e6
        return gap_ms if gap_ms >= CHUNK_MS / 2 else 0.0

    def last_loud_ns(self) -> int:
        """The end of the last voiced chunk that was also loud (where the quiet tail starts): where the words
        of the current (or last) speech end by their level; Silero's voiced chunks may run on past it."""
        return self._last_loud_end_ns

    def last_voiced_ns(self) -> int:
        """The end of the last voiced chunk of the current (or last) speech: a partial transcript whose
        audio reaches this far heard every word said so far."""
        return self._last_voiced_end_ns

    @property
    def end_silence_ms(self) -> int:
        """The silence that now ends speech (VadOptions.end_silence_ms until set_end_silence_ms)."""
        return self._end_silence_ms

    def set_end_silence_ms(self, ms: int, from_quiet: bool | None = None) -> None:
        """Ends speech after `ms` of silence from now on, the silence under way included: if it already
        lasted `ms`, speech_end comes with the next frame pushed (once Silero has scored a silent chunk).
        `from_quiet`: counted from the quiet tail's start (None: `VadOptions.end_from_quiet`)."""
        if not isinstance(ms, int | np.integer) or ms < 0:
            raise ValueError(f"the end-of-speech silence must be a whole number of ms >= 0, got {ms!r}")
        self._end_silence_ms = int(ms)
        self._end_from_quiet = self.options.end_from_quiet if from_quiet is None else from_quiet

    def set_guard(self, active: bool) -> None:
        """Echo guard on/off: while on, a speech_start needs the guard_* thresholds (see VadOptions)."""
        self._guard = active

    def push(self, frame: np.ndarray, t_ns: int) -> list[VadEdge]:
        """frame: [320] int16 PCM16 mono 16 kHz starting at `t_ns` -> the edges it decided (0 or 1)."""
        if not isinstance(frame, np.ndarray) or frame.dtype != np.int16 or frame.shape != (FRAME_SAMPLES,):
            got = f"{frame.dtype} {frame.shape}" if isinstance(frame, np.ndarray) else type(frame).__name__
            raise ValueError(f"a frame must be [{FRAME_SAMPLES}] int16 (20 ms at 16 kHz), got {got}")
        if not isinstance(t_ns, int | np.integer):
            raise ValueError(f"t_ns must be an integer (nanoseconds), got {type(t_ns).__name__}")
        if self._pending.size == 0:
            self._pending_start_ns = int(t_ns)
        self._pending = np.concatenate([self._pending, to_float(frame)])
        if self._pending.size < CHUNK_SAMPLES:  # no chunk; the wait may have shortened since the last one
            edge = self._end_if_due(int(t_ns))
            return [edge] if edge else []
        # < 320 samples remain, all from this frame: the chunk ends where they start.
        chunk, self._pending = self._pending[:CHUNK_SAMPLES], self._pending[CHUNK_SAMPLES:]
        chunk_start_ns = self._pending_start_ns
        chunk_end_ns = int(t_ns) + (FRAME_SAMPLES - self._pending.size) * NS_PER_SAMPLE
        self._pending_start_ns = chunk_end_ns
        probability = self._score(chunk)
        edge = self._decide(probability, _power_dbfs(chunk), chunk_start_ns, chunk_end_ns, int(t_ns))
        return [edge] if edge else []

    def _score(self, chunk: np.ndarray) -> float:
        if self._model is None:
            self._model = load_silero()
        window = np.concatenate([self._context, chunk[np.newaxis, :]], axis=1)
        probability, self._state = self._model.probability(window, self._state)
        self._context = window[:, -CONTEXT_SAMPLES:]
        return probability

    def _decide(self, p: float, level: float, start_ns: int, end_ns: int, now_ns: int) -> VadEdge | None:
        o = self.options
        if p < o.threshold - o.hysteresis:
            self._hear_noise(level)
        if self._speaking:
            if p >= o.threshold:
                self._speech_power += 10.0 ** (level / 10.0)
                self._speech_chunks += 1
            self._scored_until_ns, self._silent_chunk = end_ns, p < o.threshold - o.hysteresis
            if not self._silent_chunk:
                self._last_voiced_end_ns = end_ns
                if not self._quiet(level):
                    self._last_loud_end_ns = end_ns
            return self._end_if_due(now_ns)
        threshold = o.guard_threshold if self._guard else o.threshold
        if p < threshold:
            if p < threshold - o.hysteresis:
                self._onset_ns = None  # a real dip: the next voiced chunk starts a new onset
            return None
        if self._onset_ns is None:
            self._onset_ns, self._onset_voiced_ns, self._onset_power, self._onset_chunks = start_ns, 0, 0.0, 0
        self._onset_voiced_ns += end_ns - start_ns
        self._onset_power += 10.0 ** (level / 10.0)
        self._onset_chunks += 1
        min_speech_ms = o.guard_min_speech_ms if self._guard else o.min_speech_ms
        min_level = o.guard_min_level_dbfs if self._guard else o.min_level_dbfs
        mean_level = 10.0 * np.log10(self._onset_power / self._onset_chunks + 1e-12)
        if self._onset_voiced_ns < min_speech_ms * 1_000_000 or mean_level < min_level:
            return None
        onset_ns, self._onset_ns = self._onset_ns, None
        self._speaking, self._last_voiced_end_ns, self._last_loud_end_ns = True, end_ns, end_ns
        self._scored_until_ns, self._silent_chunk = end_ns, False
        self._speech_power, self._speech_chunks = self._onset_power, self._onset_chunks
        return VadEdge("speech_start", onset_ns, now_ns)

    def _end_if_due(self, now_ns: int) -> VadEdge | None:
        """speech_end, decided at the frame of `now_ns`, if the last scored chunk was silent and the silence
        up to its end has lasted the wait. Checked at every frame, not only when a chunk is scored: a wait
        shortened between two chunks (a finished sentence's score arriving) ends the speech at the next
        frame instead of the next chunk (up to 32 ms sooner)."""
        if not self._speaking or not self._silent_chunk:
            return None
        if self._scored_until_ns - self._silence_from_ns() < self._end_silence_ms * 1_000_000:
            return None
        self._speaking = False
        return VadEdge("speech_end", self._last_voiced_end_ns, now_ns)

    def _silence_from_ns(self) -> int:
        """Where the silence that ends speech is counted from: the end of the last loud voiced chunk
        (`end_from_quiet`), or of the last voiced one."""
        return self._last_loud_end_ns if self._end_from_quiet else self._last_voiced_end_ns

    def _hear_noise(self, level: float) -> None:
        """A silent chunk's level into the noise floor (a running mean in dB; digital silence counts as
        -100 dBFS, so one zeroed chunk does not make the floor meaningless)."""
        level = max(level, -100.0)
        self._noise_db = level if self._noise_db is None else 0.9 * self._noise_db + 0.1 * level

    def _quiet(self, level: float) -> bool:
        """A voiced chunk at `level` dBFS is quiet (the module docstring's quiet tail)."""
        o = self.options
        speech_db = 10.0 * np.log10(self._speech_power / max(1, self._speech_chunks) + 1e-12)
        threshold = speech_db - o.quiet_drop_db
        if self._noise_db is not None:
            near_noise = min(self._noise_db + o.quiet_margin_db, speech_db - o.quiet_min_drop_db)
            threshold = max(threshold, near_noise)
        return level < threshold
