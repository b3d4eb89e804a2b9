"""A reply started before the user is known to have finished (LiveKit calls this preemptive generation).

Once the user pauses (`SessionOptions.pause_ms` of silence), the session decodes a partial transcript that
hears the whole utterance and starts the LLM on it while the endpointer still waits for its end-of-speech
silence. The committed blocks are kept here, unspoken. At speech_end the final transcript (which reuses that
very partial when nothing was said since) either matches and the reply is adopted, its first block often
ready already, or differs and the reply is cancelled. If the user speaks on, it is cancelled at once.
Committed blocks are what the model would write for that history anyway, so adopting them is exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from voiceagent.llm import LLM, Message, ReplyBlock, ReplyOptions


class PreemptiveReply:
    """The LLM's reply to `messages`, streamed in a task of its own into a buffer until adopted."""

    def __init__(self, llm: LLM, messages: Sequence[Message], options: ReplyOptions) -> None:
        self.messages = [dict(message) for message in messages]
        self._arrived: asyncio.Queue[ReplyBlock | Exception | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(llm, options))

    async def _run(self, llm: LLM, options: ReplyOptions) -> None:
        try:
            async for block in llm.stream(self.messages, options):
                self._arrived.put_nowait(block)
        except Exception as error:  # handed to whoever adopts the reply
            self._arrived.put_nowait(error)
        finally:
            self._arrived.put_nowait(None)

    def matches(self, messages: Sequence[Message]) -> bool:
        """True if this reply answers exactly `messages` (the history with the final transcript)."""
        return self.messages == [dict(message) for message in messages]

    async def blocks(self) -> AsyncIterator[ReplyBlock]:
        """The reply's blocks: the buffered ones at once, then the rest as they come; raises its error."""
        while (item := await self._arrived.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    def cancel(self) -> None:
        """Stops the generation (the engine stops at its next block; a remote stream is closed)."""
        self._task.cancel()
