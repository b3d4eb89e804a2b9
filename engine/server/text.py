"""The server's text side: prompts to token ids (chat template or plain text), and request -> SamplingParams.

Length rules follow vLLM: a prompt must leave room for at least one generated token, and prompt + max_tokens
must fit the model's context (--max-model-len); without max_tokens the answer may fill the rest of it.
"""

from __future__ import annotations

from typing import Any

from jinja2 import TemplateError

from engine.load import chat_prompt
from engine.sampling import SamplingParams
from engine.server.protocol import APIError, ChatCompletionRequest, ChatMessage, CompletionRequest


class TextCodec:
    """Turns request prompts into token ids and checks them against the context length."""

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer, self.max_model_len, self.vocab_size = tokenizer, max_model_len, vocab_size

    def chat(self, messages: list[ChatMessage]) -> list[int]:
        """Token ids of the conversation under the model's chat template, ending with the assistant's turn."""
        try:
            ids = chat_prompt(self.tokenizer, [message.as_template_message() for message in messages])
        except (ValueError, TemplateError) as error:
            raise APIError(
                400, f"The messages do not fit this model's chat template: {error}", param="messages"
            ) from None
        self._check_length(ids, "messages")
        return ids

    def completion(self, prompt: str | list[int] | list[str]) -> list[int]:
        """Token ids of a plain prompt: ids as given, or text with special tokens added as vLLM does."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=True))
        else:
            ids = [int(token) for token in prompt]
            if any(not 0 <= token < self.vocab_size for token in ids):
                raise APIError(
                    400,
                    f"Token ids in the prompt must be in [0, {self.vocab_size}).",
                    param="prompt",
                    code="invalid_value",
                )
        if not ids:
            raise APIError(
                400, "The prompt is empty: give at least one token.", param="prompt", code="invalid_value"
            )
        self._check_length(ids, "prompt")
        return ids

    def _check_length(self, ids: list[int], param: str) -> None:
        if len(ids) >= self.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, your {param} "
                f"has {len(ids)} tokens, which leaves no room for an answer. Please shorten the {param}.",
                param=param,
                code="context_length_exceeded",
            )


def sampling_params(
    request: ChatCompletionRequest | CompletionRequest, n_prompt: int, max_model_len: int
) -> SamplingParams:
    """The engine's sampling parameters for `request`; APIError(400) when they cannot be honoured."""
    room = max_model_len - n_prompt
    requested = request.requested_max_tokens()
    if requested is not None and requested > room:
        param = "max_tokens"
        if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens is not None:
            param = "max_completion_tokens"
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{n_prompt + requested} tokens ({n_prompt} in the prompt, {requested} in the completion). "
            f"Please reduce the length of the prompt or {param} (at most {room} here).",
            param=param,
            code="context_length_exceeded",
        )
    try:
        return SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=max(0, request.top_k),
            max_new_tokens=requested if requested is not None else room,
            stop=request.stop_strings(),
            seed=request.seed,
            ignore_eos=request.ignore_eos,
        )
    except ValueError as error:
        raise APIError(400, str(error), code="invalid_value") from None
