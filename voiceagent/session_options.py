"""How a voice session behaves: its settings, one frozen dataclass (voiceagent/session.py uses them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from voiceagent.llm import ReplyOptions
from voiceagent.turn_taking import TurnTakingOptions

__all__ = ["SPEECH_SYSTEM_PROMPT", "SessionOptions"]

SPEECH_SYSTEM_PROMPT = (
    "You are a friendly voice assistant talking with someone on a call. Answer in one or two short "
    "spoken sentences. Use plain words only: no lists, no markdown, no code, no emoji."
)


@dataclass(frozen=True)
class SessionOptions:
    system_prompt: str = SPEECH_SYSTEM_PROMPT
    output_rate: int = 16000  # the transport's rate for the agent's audio
    partial_every_ms: int = 300  # partial transcripts while the user speaks
    echo_guard: bool = False  # phone lines: raise the VAD bar while the agent speaks
    # Silence after which a partial hears the whole utterance (Silero scores 32 ms chunks, so 32 is its first
    # silent chunk), and after which a second one hears it with the silence that punctuates it (0: none;
    # voiceagent/partials.py). Both below the shortest end-of-turn wait.
    pause_ms: int = 32
    late_pause_ms: int = 128
    # The first pause partial also starts once the audio has been this quiet this long (the endpointer's
    # quiet tail, ahead of Silero's silence over a noise floor; 0: only on Silero's silence).
    pause_quiet_ms: int = 32
    preemptive_reply: bool = True  # start the reply on that partial, before speech_end
    speak_ahead: bool = True  # and render that reply's first phrase before it is adopted
    prefill_while_speaking: bool = True  # feed the stable words to the draft model as they come
    reply: ReplyOptions = field(default_factory=lambda: ReplyOptions(max_tokens=120))
    max_turn_s: float | None = None  # longest utterance, and longest reply in the making (None: no limit)
    # Speech over the reply holds it; without real words it resumes after this long (voiceagent/barge_in.py).
    # None: any speech over the reply interrupts it at once.
    resume_after_ms: float | None = 1000.0
    # The end-of-turn wait from each partial's score (voiceagent/endpointing.py); None: the fixed silence.
    turn_taking: TurnTakingOptions | None = field(default_factory=TurnTakingOptions)
