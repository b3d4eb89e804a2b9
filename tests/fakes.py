"""Fakes for unit tests: tiny random Hugging Face models of each architecture, and a toy tokenizer."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from engine.config import ModelArgs
from engine.generate import Engine
from engine.model import Transformer
from engine.weights import build_model

TINY_VOCAB = 96

_BASE: dict[str, Any] = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
}

# One tiny config per architecture the engine claims: the features each exercises are in the name.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama2": {
        **_BASE,
        "model_type": "llama",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "llama3-rope-scaling": {
        **_BASE,
        "model_type": "llama",
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "smollm2-tied": {**_BASE, "model_type": "llama", "tie_word_embeddings": True, "num_key_value_heads": 1},
    "qwen2-bias": {
        **_BASE,
        "model_type": "qwen2",
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "mistral-sliding-window": {**_BASE, "model_type": "mistral", "sliding_window": 7},
}


def tiny_hf_model(kind: str, seed: int = 0, init_std: float = 0.02, **overrides: Any) -> Any:
    """A transformers model of `kind` (a key of TINY_CONFIGS) with random fp32 weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config_dict = {**TINY_CONFIGS[kind], **overrides, "initializer_range": init_std}
    config = AutoConfig.for_model(**config_dict)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Norm weights start at 1 and biases at 0: perturb them so the test sees them used.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    return model.eval()


def engine_model_from_hf(
    hf_model: Any, max_seq_len: int = 256, dtype: torch.dtype = torch.float32
) -> Transformer:
    args = ModelArgs.from_hf_config(hf_model.config.to_dict())
    state = hf_model.state_dict()
    return build_model(args, state.__getitem__, max_seq_len=max_seq_len, dtype=dtype, device="cpu")


def perturbed_copy(hf_model: Any, scale: float, seed: int) -> Any:
    """A draft that mostly agrees with its target: the same weights plus relative noise."""
    import copy

    draft = copy.deepcopy(hf_model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(scale * param.std() * torch.randn(param.shape, generator=generator))
    return draft


class FakeTokenizer:
    """Token i decodes to the word ' w{i}'; id 0 is EOS and decodes to nothing."""

    eos_token_id = 0

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join("" if i == 0 and skip_special_tokens else f" w{i}" for i in token_ids)


def tiny_engine(
    kind: str = "llama2",
    draft: str | None = "perturbed",
    *,
    seed: int = 0,
    gamma: int | str = 4,
    max_seq_len: int = 256,
    init_std: float = 0.02,
    draft_noise: float = 0.5,
    eos: bool = False,
    **overrides: Any,
) -> Engine:
    """An engine on a tiny random target; draft 'perturbed' (agrees often), 'independent', or None."""
    target_hf = tiny_hf_model(kind, seed, init_std, **overrides)
    draft_hf = None
    if draft == "perturbed":
        draft_hf = perturbed_copy(target_hf, draft_noise, seed + 1000)
    elif draft == "independent":
        draft_hf = tiny_hf_model(kind, seed + 1000, init_std, **overrides)
    return Engine(
        engine_model_from_hf(target_hf, max_seq_len),
        engine_model_from_hf(draft_hf, max_seq_len) if draft_hf is not None else None,
        FakeTokenizer(),
        eos_ids=(0,) if eos else (),
        gamma=gamma,
    )


# ----- voice pipeline fakes -----------------------------------------------------------------------------


class FakeClock:
    """Time that moves only when told to; `sleep` advances it at once."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.t_ns = start_ns

    def now_ns(self) -> int:
        return self.t_ns

    def advance(self, seconds: float) -> None:
        self.t_ns += int(seconds * 1e9)

    async def sleep(self, seconds: float) -> None:
        import asyncio

        self.advance(seconds)
        await asyncio.sleep(0)


class FakeEdge:
    def __init__(self, kind: str, t_ns: int, confirmed_ns: int) -> None:
        self.kind, self.t_ns, self.confirmed_ns = kind, t_ns, confirmed_ns


class FakeEndpointer:
    """Speech is any frame whose peak exceeds `level`; speech ends after `end_frames` quiet frames.
    `silence_lag_frames`: the silence is reported that many frames after the quiet tail starts (Silero's lag
    behind the level over a noise floor)."""

    def __init__(
        self, level: int = 1000, end_frames: int = 10, frame_ns: int = 20_000_000, silence_lag_frames: int = 0
    ) -> None:
        self.level, self.end_frames, self.frame_ns = level, end_frames, frame_ns
        self.silence_lag_frames = silence_lag_frames
        self._speaking, self._quiet, self._last_voiced_end = False, 0, 0
        self.guarded = False
        self.waits: list[tuple[int, bool | None]] = []  # each set_end_silence_ms: (ms, from_quiet)

    def push(self, frame: Any, t_ns: int) -> list[FakeEdge]:
        voiced = int(abs(frame.astype("int32")).max()) > self.level * (4 if self.guarded else 1)
        if voiced:
            self._quiet, self._last_voiced_end = 0, t_ns + self.frame_ns
            if not self._speaking:
                self._speaking = True
                return [FakeEdge("speech_start", t_ns, t_ns)]
            return []
        if self._speaking:
            self._quiet += 1
            if self._quiet >= self.end_frames:
                self._speaking = False
                return [FakeEdge("speech_end", self._last_voiced_end, t_ns)]
        return []

    def speaking(self) -> bool:
        return self._speaking

    def silence_ms(self) -> float:
        silent_frames = max(0, self._quiet - self.silence_lag_frames)
        return silent_frames * self.frame_ns / 1e6 if self._speaking else 0.0

    def quiet_ms(self) -> float:
        return self._quiet * self.frame_ns / 1e6 if self._speaking else 0.0

    def set_guard(self, active: bool) -> None:
        self.guarded = active

    def last_voiced_ns(self) -> int:
        return self._last_voiced_end

    def last_loud_ns(self) -> int:  # no level of its own: every voiced frame is loud
        return self._last_voiced_end

    def set_end_silence_ms(self, ms: int, from_quiet: bool | None = None) -> None:
        self.end_frames = max(1, -(-ms * 1_000_000 // self.frame_ns))
        self.waits.append((ms, from_quiet))


class FakeTranscript:
    def __init__(self, stable: str, text: str) -> None:
        self.stable, self.text = stable, text


class FakeRecognizer:
    """Hears `text` (one word per 10 frames pushed, for partials; the last `stable_lag` words heard are not
    stable yet); `error` makes the final fail."""

    def __init__(
        self, text: str = "hello there", error: Exception | None = None, stable_lag: int = 1
    ) -> None:
        self.text, self.error, self.stable_lag = text, error, stable_lag
        self.frames = 0
        self.utterances = 0
        self.trailing_ms: list[float] = []  # what each final was told of the audio's trailing silence

    def start(self) -> None:
        self.frames = 0
        self.utterances += 1

    def push(self, frame: Any) -> None:
        self.frames += 1

    def decode_partial(self) -> FakeTranscript:
        words = self.text.split()[: self.frames // 10]
        return FakeTranscript(" ".join(words[: max(0, len(words) - self.stable_lag)]), " ".join(words))

    def decode_final(self, trailing_silence_ms: float = 0.0) -> str:
        self.trailing_ms.append(trailing_silence_ms)
        if self.error is not None:
            raise self.error
        return self.text


class HeldRecognizer(FakeRecognizer):
    """Its partials wait until `release` is set, then hear the frames pushed by then."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.release, self.calls = threading.Event(), 0

    def decode_partial(self) -> FakeTranscript:
        self.calls += 1
        self.release.wait(5)
        return super().decode_partial()


class StoppableFakeRecognizer(FakeRecognizer):
    """Hears as FakeRecognizer; each partial first waits until `release` is set (or `hold_s` has passed),
    unless `stop_partial` ends it first: it then raises `PartialStopped`, as Moonshine's does at its next
    decoder call. With no partial decoding, `stop_partial` does nothing."""

    def __init__(self, text: str, hold_s: float | None = None) -> None:
        super().__init__(text)
        self.hold_s, self.release = hold_s, threading.Event()
        self.calls = self.stopped = 0
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None

    def stop_partial(self) -> None:
        with self._lock:
            if self._stop is not None:
                self._stop.set()

    def decode_partial(self) -> FakeTranscript:
        from voiceagent.stages import PartialStopped

        self.calls += 1
        with self._lock:
            self._stop = stop = threading.Event()
        try:
            deadline = None if self.hold_s is None else time.monotonic() + self.hold_s
            while not self.release.is_set() and (deadline is None or time.monotonic() < deadline):
                if stop.wait(0.002):
                    self.stopped += 1
                    raise PartialStopped("stopped")
            return super().decode_partial()
        finally:
            with self._lock:
                self._stop = None


class FakeLLM:
    """Streams `blocks` (texts) for every reply, recording the histories it was asked with."""

    def __init__(
        self,
        blocks: Sequence[str] = ("Hi,", " nice", " to meet", " you."),
        error_after: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.blocks, self.error_after, self.delay_s = list(blocks), error_after, delay_s
        self.histories: list[list[dict[str, str]]] = []
        self.prefills: list[tuple[list[dict[str, str]], bool]] = []

    async def prefill(self, messages: Any, *, draft_only: bool = False) -> bool:
        self.prefills.append(([dict(m) for m in messages], draft_only))
        return True

    async def stream(self, messages: Any, options: Any = None) -> Any:
        import asyncio

        from voiceagent.llm import LLMError, ReplyBlock

        self.histories.append([dict(m) for m in messages])
        for i, text in enumerate(self.blocks):
            if self.error_after is not None and i >= self.error_after:
                raise LLMError("the engine failed")
            await asyncio.sleep(self.delay_s)
            yield ReplyBlock(text=text, n_tokens=1, n_drafted=4, n_accepted=2)

    async def aclose(self) -> None:
        return None


class FakeProposingLLM(FakeLLM):
    """A FakeLLM whose blocks carry token ids (block i: id i + 1) and that takes proposals (ProposingLLM)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.proposals: list[list[int]] = []

    def stream(self, messages: Any, options: Any = None) -> Any:
        return self.stream_proposed(messages, options, ())

    async def stream_proposed(self, messages: Any, options: Any, proposal: Sequence[int]) -> Any:
        import dataclasses

        self.proposals.append(list(proposal))
        i = 0
        async for block in FakeLLM.stream(self, messages, options):
            i += 1
            yield dataclasses.replace(block, token_ids=(i,))


class FakeSynthesizer:
    """Speaks each word as `word_ms` of a 440 Hz tone at 16 kHz, one chunk per word."""

    sample_rate = 16000
    name = "fake"

    def __init__(self, word_ms: int = 100, error: Exception | None = None) -> None:
        self.word_ms, self.error = word_ms, error
        self.spoken: list[str] = []

    def synthesize(self, text: str) -> Any:
        import numpy as np

        if self.error is not None:
            raise self.error
        self.spoken.append(text)
        n = self.sample_rate * self.word_ms // 1000
        tone = (3000 * np.sin(2 * np.pi * 440 * np.arange(n) / self.sample_rate)).astype(np.int16)
        for _ in text.split():
            yield tone


class WordChunker:
    """A chunker for session tests: every whole word is a phrase (a word split across blocks waits)."""

    def __init__(self) -> None:
        self.pending = ""

    def push(self, text: str) -> list[str]:
        self.pending += text
        *words, self.pending = self.pending.split(" ")
        return [w for w in words if w]

    def flush(self) -> list[str]:
        words, self.pending = [w for w in self.pending.split(" ") if w], ""
        return words


# ----- Real speech for the speech-in tests (VAD, ASR): espeak-ng at 16 kHz, with known bounds ------------


def espeak_speech(text: str, directory: Any, voice: str = "en-us", words_per_minute: int = 150) -> Any:
    """`text` spoken by espeak-ng (written into `directory`) -> [n] int16 PCM16 mono 16 kHz."""
    import hashlib
    import subprocess
    from pathlib import Path

    from voiceagent.audio import read_wav

    name = hashlib.sha256(f"{voice}|{words_per_minute}|{text}".encode()).hexdigest()[:16]
    path = Path(directory) / f"espeak-{name}.wav"
    if not path.exists():
        command = ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(path), text]
        subprocess.run(command, check=True, capture_output=True)
    return read_wav(path)


def silence(seconds: float) -> Any:
    import numpy as np

    return np.zeros(int(seconds * 16000), dtype=np.int16)


def voiced_bounds(pcm16: Any, level: int = 100) -> tuple[float, float]:
    """Seconds of the first and last sample louder than `level` (about -50 dBFS)."""
    import numpy as np

    loud = np.flatnonzero(np.abs(pcm16.astype(np.int32)) > level)
    return loud[0] / 16000, (loud[-1] + 1) / 16000


class FakePipeline:
    """`Pipeline.new_session` on the fakes above, for gateway tests: every session hears `transcript` and
    answers `blocks`, each word spoken as `word_ms` of tone. The sessions made are kept in `sessions`."""

    def __init__(
        self,
        blocks: Sequence[str] = ("Hi,", " nice", " to meet", " you."),
        transcript: str = "hello there",
        word_ms: int = 100,
        llm_delay_s: float = 0.0,
    ) -> None:
        self.blocks, self.transcript = blocks, transcript
        self.word_ms, self.llm_delay_s = word_ms, llm_delay_s
        self.sessions: list[Any] = []

    def new_session(self, clock: Any, trace: Any, options: Any = None) -> Any:
        from voiceagent.session import Session

        session = Session(
            endpointer=FakeEndpointer(),
            recognizer=FakeRecognizer(self.transcript),
            llm=FakeLLM(self.blocks, delay_s=self.llm_delay_s),
            synthesizer=FakeSynthesizer(self.word_ms),
            new_chunker=WordChunker,
            clock=clock,
            trace=trace,
            options=options,
        )
        self.sessions.append(session)
        return session

    async def warm_up(self) -> None:
        return None
