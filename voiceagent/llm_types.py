"""The voice agent's LLM interface: what a reply is made of and what an LLM backend offers.

The types every LLM backend shares (voiceagent/llm.py: the in-process engine and OpenAI-compatible
servers) and the protocols the session checks for optional abilities (prefill, end-of-turn score,
proposals). `voiceagent.llm` re-exports them all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = [
    "DEFAULT_OPTIONS",
    "BlockCost",
    "LLM",
    "LLMError",
    "Message",
    "PrefillingLLM",
    "ProposingLLM",
    "ReplyBlock",
    "ReplyOptions",
    "TurnScoringLLM",
]

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


@dataclass(frozen=True)
class ReplyOptions:
    """How to sample a reply (greedy by default: the same words every time for the same history)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class ReplyBlock:
    """One committed block of the reply. The counts are None where the server does not report them."""

    text: str
    n_tokens: int | None = None
    n_drafted: int | None = None
    n_accepted: int | None = None
    finish_reason: str | None = None  # on the last block: "stop", "length" (or "cancelled" locally)
    token_ids: tuple[int, ...] = ()  # the in-process engine's ids (what a later reply may propose again)
    timing: BlockCost | None = None  # where the in-process engine's time for it went (None: a server's)


@dataclass(frozen=True)
class BlockCost:
    """Where a block's time went in the in-process engine, ms: `waited` before its work began (the event
    loop taking the last block's text, other conversations' jobs on the engine thread, the speech jobs it
    let go first: voiceagent/cpu_lane.py), then its work (`engine`): the draft's steps (`draft`), the
    target's verify (`verify`), and the rest (on the first block a prefill, and the text). `held`: how
    much of `engine` its forwards spent held between layers while speech jobs ran
    (`Engine.pause_between_layers`)."""

    waited: float
    engine: float
    draft: float
    verify: float
    held: float = 0.0


class LLMError(RuntimeError):
    """The model could not answer: bad input, an engine failure, or an unreachable or refusing server."""


class LLM(Protocol):
    """What the voice pipeline's LLM stage needs."""

    def stream(self, messages: Sequence[Message], options: ReplyOptions = ...) -> AsyncIterator[ReplyBlock]:
        """Streams the reply to `messages` (the whole history, ending with the user's turn)."""
        ...

    async def aclose(self) -> None:
        """Stops any generation in flight and releases connections."""
        ...


@runtime_checkable
class PrefillingLLM(Protocol):
    """An LLM that can cache a prompt ahead of the reply (the in-process engine can; a server cannot)."""

    async def prefill(self, messages: Sequence[Message], *, draft_only: bool = False) -> bool: ...


@runtime_checkable
class TurnScoringLLM(Protocol):
    """An LLM that scores how likely the user's words so far end their turn (the in-process engine).
    `reply_next`: a reply to these very messages will be asked for next, so the score may compute its
    start too."""

    async def end_of_turn_probability(
        self, messages: Sequence[Message], *, reply_next: bool = False
    ) -> float | None: ...


@runtime_checkable
class ProposingLLM(Protocol):
    """An LLM that can take a proposed start of the reply (the ids of a reply to slightly different words)
    and verify it instead of writing it token by token: the same reply, sooner (engine/proposal.py)."""

    def stream_proposed(
        self, messages: Sequence[Message], options: ReplyOptions, proposal: Sequence[int]
    ) -> AsyncIterator[ReplyBlock]: ...


DEFAULT_OPTIONS = ReplyOptions()
