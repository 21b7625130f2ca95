"""Sampling parameters onto OpenAI request fields, and the text and usage out of answers.

Sent as OpenAI fields: ``max_tokens``, ``temperature`` (always; 0 is greedy on every
OpenAI-compatible server), ``top_p`` (when not 1), ``stop``, ``seed``,
``presence_penalty`` and ``frequency_penalty`` (when not 0); ``n`` is always 1 (not sent).

``top_k``, ``repetition_penalty``, ``ignore_eos`` and ``stop_token_ids`` are not OpenAI
fields. vLLM, SGLang and the builtin engine accept them as extensions, so they are sent
in the body, but only when they differ from their defaults (0, 1, false, []): a request
that does not use them stays a plain OpenAI request, and one that does fails with the
endpoint's 400 on an endpoint that refuses unknown fields (OpenAI itself) instead of being
silently sampled differently. Nothing else of :class:`SamplingParams` exists.

An output ``format`` goes as the endpoint's structured-output request
(:mod:`parrot.engines.openai.structured_outputs`: ``response_format`` for JSON, vLLM / SGLang
/ llama.cpp fields for a regex, choice or grammar).

``max_tokens`` is sent under that name for the chat API too (OpenAI's reasoning models
want ``max_completion_tokens`` and answer 400; most compatible servers know only
``max_tokens``).
"""

from __future__ import annotations

from typing import Any

from parrot.engines.openai.chat_messages import to_messages
from parrot.engines.openai.config import CHAT, OpenAIEngineConfig
from parrot.engines.openai.structured_outputs import extra_fields, response_format
from parrot.engines.protocol.text import replace_invalid
from parrot.wire.sampling import SamplingParams


def build_request(config: OpenAIEngineConfig, text: str, sampling: SamplingParams) -> dict[str, Any]:
    """The keyword arguments of ``completions.create`` / ``chat.completions.create``."""
    body: dict[str, Any] = {
        "model": config.model,
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
    }
    if sampling.top_p != 1:
        body["top_p"] = sampling.top_p
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.presence_penalty:
        body["presence_penalty"] = sampling.presence_penalty
    if sampling.frequency_penalty:
        body["frequency_penalty"] = sampling.frequency_penalty
    extra: dict[str, Any] = {}
    if sampling.top_k:
        extra["top_k"] = sampling.top_k
    if sampling.repetition_penalty != 1:
        extra["repetition_penalty"] = sampling.repetition_penalty
    if sampling.ignore_eos:
        extra["ignore_eos"] = True
    if sampling.stop_token_ids:
        extra["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.format is not None:
        extra.update(extra_fields(sampling.format))
        shape = response_format(sampling.format)
        if shape is not None and config.api == CHAT:
            body["response_format"] = shape
        elif shape is not None:  # the client's completions.create has no such argument
            extra["response_format"] = shape
    if extra:
        body["extra_body"] = extra
    if config.api == CHAT:
        body["messages"] = to_messages(text)
    else:
        body["prompt"] = text
    return body


def choice_text(api: str, choice: Any) -> str:
    """The text of a choice (a whole answer's, or a stream chunk's delta), as valid text: a
    lone surrogate the endpoint sent (a JSON escape) becomes U+FFFD."""
    if api != CHAT:
        return replace_invalid(choice.text or "")
    message = getattr(choice, "message", None) or getattr(choice, "delta", None)
    return replace_invalid((getattr(message, "content", None) or "") if message is not None else "")


def usage_counts(usage: Any) -> tuple[int, int]:
    """(prompt_tokens, cached_tokens) of an answer's usage, zeros when absent."""
    if usage is None:
        return 0, 0
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return int(usage.prompt_tokens or 0), int(cached or 0)
