"""A batch-1 speculative-decoding engine in PyTorch: token ids in, committed blocks out.

The contract: `load_engine(EngineOptions(target, draft, ...))` gives an `Engine`; `engine.new_conversation()`
a `Conversation` that owns its KV caches; `conversation.generate(prompt_ids, SamplingParams(...))` a plain
generator of `CommittedBlock`s, each final (exactly what the target alone would have produced).
`chat_prompt(engine.tokenizer, messages)` turns chat messages into prompt ids. The engine knows nothing of
asyncio, audio or sockets; `engine.server` puts it behind an OpenAI-compatible HTTP API.
"""

from engine.generate import CommittedBlock, Conversation, Engine
from engine.load import chat_prompt, load_engine
from engine.options import EngineOptions
from engine.sampling import SamplingParams

__all__ = [
    "CommittedBlock",
    "Conversation",
    "Engine",
    "EngineOptions",
    "SamplingParams",
    "chat_prompt",
    "load_engine",
]
