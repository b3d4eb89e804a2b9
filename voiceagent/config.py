"""The voice agent's settings, read from VOICEAGENT_* environment variables and checked when read.

    VOICEAGENT_LLM           "local" (the engine in this process) or an OpenAI-compatible base URL, e.g.
                             http://127.0.0.1:8000/v1 (`python -m engine serve`) or http://vllm:8000/v1
    VOICEAGENT_LLM_MODEL     the model id to ask a remote server for (default: the first it lists)
    VOICEAGENT_LLM_API_KEY   bearer key for a remote server started with --api-key
    VOICEAGENT_LLM_TIMEOUT_S longest wait for the LLM's next block, in seconds: a remote server's next chunk,
                             or the local engine's next block (a stalled engine is told to cancel); the
                             turn then fails with a `turn_failed` error and the session carries on
    VOICEAGENT_TARGET, VOICEAGENT_DRAFT ("none" for plain decoding), VOICEAGENT_GAMMA (an integer or
    "auto"), VOICEAGENT_QUANT and VOICEAGENT_DRAFT_QUANT ("none"; "int8", "int4" on the CPU; "fp8" on
    Hopper GPUs),
    VOICEAGENT_DTYPE, VOICEAGENT_DEVICE, VOICEAGENT_MAX_SEQ_LEN, VOICEAGENT_BACKEND ("ggml": the GGUF
    files on llama.cpp's CPU kernels, the default; "torch": PyTorch, for GPUs): the local engine.
    VOICEAGENT_ASR_MODEL ("tiny.en", "base" or "moonshine-base"), VOICEAGENT_TTS ("piper" or "espeak"),
    VOICEAGENT_END_SILENCE_MS (endpointing), VOICEAGENT_OUTPUT_RATE, VOICEAGENT_SESSION_CONTEXT_TOKENS (each
    session's KV cache; the oldest turns are dropped to fit): the voice pipeline.
    VOICEAGENT_TURN_SCORE (1: with the local engine, the silence that ends the user's turn follows the
    end-of-turn score of their words; 0: always VOICEAGENT_END_SILENCE_MS), VOICEAGENT_TURN_SCORE_MODEL
    ("draft", the default; "target"; "auto": the target where it is fed the words ahead, on a CPU, else
    the draft),
    VOICEAGENT_TURN_COMPLETE_SCORE (0.4) and VOICEAGENT_TURN_INCOMPLETE_SCORE (0.01): the scores at or
    above which a turn ends after VOICEAGENT_TURN_COMPLETE_SILENCE_MS (120) and at or below which it waits
    VOICEAGENT_TURN_INCOMPLETE_SILENCE_MS (2000); VOICEAGENT_TURN_PENDING_SILENCE_MS (500): the least wait
    while the latest words are not scored yet; VOICEAGENT_TURN_HEARD_SLACK_MS (80): how far before the last
    voiced chunk a partial's audio may end and still count as hearing every word; VOICEAGENT_TURN_DIGITS_WAIT
    (1: words ending in a digit, a number being dictated, wait as incomplete);
    VOICEAGENT_TURN_EARLY_COMPLETE_SCORE (0.5): the score a partial that heard less than
    VOICEAGENT_TURN_SETTLED_SILENCE_MS (100) of silence after the words needs to end the turn quickly;
    VOICEAGENT_TURN_PAUSE_QUIET_MS (32): the pause partial also starts after this much quiet audio, ahead
    of Silero's first silent chunk (0: on Silero's alone; voiceagent/partials.py);
    VOICEAGENT_TURN_AUDIO_WEIGHT (0: the words alone) and VOICEAGENT_TURN_AUDIO_BIAS (2.0): how much Smart
    Turn's probability from the sound of the turn moves the words' score (voiceagent/turn_taking.py).
    VOICEAGENT_HOST, VOICEAGENT_PORT: where `voiceagent serve` listens (127.0.0.1:8000).
    VOICEAGENT_API_KEY       when set, /ws and WebRTC signalling need it (`Authorization: Bearer KEY` or
                             `?token=KEY`)
    VOICEAGENT_ALLOWED_ORIGINS  comma-separated browser origins allowed on /ws and signalling, e.g.
                             "https://example.com,http://localhost:3000"; "*" allows any; empty (the
                             default) allows the server's own origin and clients that send no Origin
    VOICEAGENT_MAX_SESSIONS, VOICEAGENT_IDLE_TIMEOUT_S, VOICEAGENT_MAX_MESSAGE_BYTES: gateway limits.
    VOICEAGENT_MAX_SESSION_S  a session this long is ended (close 4410 with a reason; 3600 by default)
    VOICEAGENT_MAX_TURN_S    a user utterance longer than this is cut off and not answered, and a reply
                             still being made after this long is stopped: either way the turn ends with a
                             `turn_too_long` error and the session carries on (60 by default)
    VOICEAGENT_TWILIO_AUTH_TOKEN  when set, Twilio's X-Twilio-Signature is checked on /twilio/voice and
                             /twilio; VOICEAGENT_PUBLIC_URL (e.g. https://agent.example.com) is the URL
                             Twilio calls, for the TwiML stream URL and the signature (default: the
                             request's own Host and X-Forwarded-Proto).
    VOICEAGENT_WEB_DIR (the browser demo's static files), VOICEAGENT_TRACE_DIR (one JSONL trace per
    gateway session, off by default), VOICEAGENT_RECORD_AUDIO (1: keep each session's input audio beside
    its trace, for `voiceagent replay`; off by default).

A bad value raises pydantic's ValidationError (a ValueError) naming the variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

LOCAL = "local"


class Settings(BaseSettings):
    """Settings of one voice-agent process (defaults: everything in-process on the bundled Qwen pair)."""

    model_config = SettingsConfigDict(env_prefix="VOICEAGENT_", extra="ignore", frozen=True)

    llm: str = LOCAL
    llm_model: str | None = None
    llm_api_key: SecretStr | None = None
    llm_timeout_s: float = Field(60.0, gt=0)
    target: str = "qwen2.5-coder-1.5b-instruct"
    draft: str = "qwen2.5-coder-0.5b-instruct"
    # The fastest exact setting on a CPU: the target's GGUF blocks on the engine's own kernel (backend
    # native: 1.27x llama.cpp's decoding, 1.7-1.9x its prompt eval, a verify of 5 ids 1.5x a step; voice
    # to voice p50 420 / 340 ms against 457 / 429 on ggml, alternating; AMD EPYC Zen 5, AVX-512,
    # bench/results/2026-12-04-cpu-zen5-native-kernel.md), the draft on llama.cpp's kernels, with an
    # adaptive draft length, which falls back to plain decoding where drafting does not pay. "ggml" runs
    # both files on llama.cpp's kernels. On a GPU set VOICEAGENT_BACKEND=torch (and
    # VOICEAGENT_QUANT / VOICEAGENT_DRAFT_QUANT=fp8 on Hopper); quant applies to the torch backend only.
    backend: Literal["torch", "ggml", "native"] = "native"
    gamma: int | Literal["auto"] = "auto"
    quant: Literal["none", "int8", "int4", "fp8"] = "none"
    draft_quant: Literal["none", "int8", "int4", "fp8"] = "none"
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    device: str = "cpu"
    max_seq_len: int = Field(4096, ge=2)
    # moonshine-base (voiceagent/moonshine.py, on its float graphs): on real recorded speech WER 0.052 at
    # 16 kHz and 0.045 on the phone band against tiny.en's 0.134 / 0.119 and base's 0.067 / 0.075, with the
    # quickest final and the least CPU; voice to voice side by side 1754 ms p50 against tiny.en's 1965 (AMD
    # EPYC, AVX2, bench/results/2026-12-01-cpu-asr-moonshine.md). "tiny.en" or "base" for faster-whisper (the
    # reference implementation), or a CTranslate2 Whisper directory.
    asr_model: str = "moonshine-base"
    tts: Literal["piper", "espeak"] = "piper"  # piper falls back to espeak-ng without the GPL extra
    # Each voice session's own KV cache length (the oldest turns are dropped to fit): 1024 ids cost ~42 MB
    # for the bundled Qwen pair, so sessions are cheap; the engine's max_seq_len is the ceiling.
    session_context_tokens: int = Field(1024, ge=64)
    end_silence_ms: int = Field(320, ge=0, le=3000)  # silence that ends the user's turn (no score)
    # Turn-taking from the end-of-turn score (voiceagent/turn_taking.py; calibrated by bench/turn_taking).
    turn_score: bool = True
    # Whose cache scores the end of turn (engine Conversation.end_of_turn_probability): "auto" is the target
    # where the target is fed ahead (a CPU), else the draft.
    turn_score_model: Literal["auto", "draft", "target"] = "draft"
    # That model's trained end-of-turn head (engine/turn_head.py, bench/turn_taking/train_head.py) gives the
    # score where it has one; off by default: on speech it lifted fragments as well as finished questions
    # (bench/results/2026-12-06-cpu-xeon-amx-turn-head.md).
    turn_head: bool = False
    turn_complete_score: float = Field(0.4, gt=0, le=1)
    turn_incomplete_score: float = Field(0.01, gt=0, lt=1)
    turn_complete_silence_ms: int = Field(120, ge=0, le=3000)
    turn_incomplete_silence_ms: int = Field(2000, ge=0, le=5000)
    turn_pending_silence_ms: int = Field(500, ge=0, le=5000)
    turn_heard_slack_ms: int = Field(80, ge=0, le=500)
    turn_digits_wait: bool = True
    turn_settled_silence_ms: int = Field(100, ge=0, le=1000)
    turn_early_complete_score: float = Field(0.5, gt=0, le=1)
    # Words the recogniser picked a token of below this probability wait at least turn_unsure_silence_ms
    # (0: off; voiceagent/turn_taking.py says why).
    turn_unsure_probability: float = Field(0.15, ge=0, le=1)
    turn_unsure_silence_ms: int = Field(500, ge=0, le=10000)
    # The pause partial on the quiet tail too (0: on Silero's silence only).
    turn_pause_quiet_ms: int = Field(32, ge=0, le=1000)
    # Smart Turn v3.2's audio probability beside the text score (voiceagent/smart_turn.py; 0: words alone).
    turn_audio_weight: float = Field(0.0, ge=0, le=1)
    turn_audio_bias: float = Field(2.0, ge=-10, le=10)
    output_rate: int = Field(16000, ge=8000, le=48000)  # sample rate of the agent's audio
    # The gateway (`voiceagent serve`).
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: SecretStr | None = None
    allowed_origins: str = ""
    max_sessions: int = Field(4, ge=1)  # one engine is shared: more sessions share its time
    idle_timeout_s: float = Field(60.0, gt=0)  # nothing from the client this long (and no reply) -> closed
    max_message_bytes: int = Field(65536, ge=1024)  # one WebSocket message (1 s of 16 kHz PCM16 = 32000)
    max_session_s: float = Field(3600.0, gt=0)  # then the session is closed (4410)
    max_turn_s: float = Field(60.0, gt=0)  # a longer utterance is cut off; a longer reply is stopped
    twilio_auth_token: SecretStr | None = None
    public_url: str | None = None
    record_audio: bool = False  # the user's input audio beside each trace (needs VOICEAGENT_TRACE_DIR)
    web_dir: Path | None = None  # default: web/ beside the voiceagent package
    trace_dir: Path | None = None

    @field_validator("llm")
    @classmethod
    def _local_or_url(cls, value: str) -> str:
        value = value.strip()
        if value == LOCAL:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                "VOICEAGENT_LLM must be 'local' or an http(s) URL such as http://127.0.0.1:8000/v1, "
                f"got {value!r}"
            )
        return value.rstrip("/")

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"VOICEAGENT_GAMMA must be >= 0 or 'auto', got {value}")
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"VOICEAGENT_PUBLIC_URL must be an http(s) URL, got {value!r}")
        return value.strip().rstrip("/")

    @property
    def origins(self) -> tuple[str, ...]:
        """The allowed browser origins (see VOICEAGENT_ALLOWED_ORIGINS), without trailing slashes."""
        return tuple(o.strip().rstrip("/") for o in self.allowed_origins.split(",") if o.strip())

    @property
    def llm_is_local(self) -> bool:
        return self.llm == LOCAL

    @property
    def draft_model(self) -> str | None:
        """The draft to load, or None for plain decoding."""
        return None if self.draft.lower() == "none" else self.draft
