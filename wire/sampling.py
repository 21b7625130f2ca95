"""Sampling parameters: the wire format of Generate, validated by msgspec at the edge."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from parrot.wire.formats import OutputFormat

# Temperatures below this are treated as greedy: dividing logits by a near-zero temperature
# overflows to inf and the softmax to NaN (vLLM uses the same threshold).
GREEDY_TEMPERATURE: Final = 1e-5

StopString = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
TokenId = Annotated[int, msgspec.Meta(ge=0)]


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How to sample one generation. Out-of-range values fail msgspec validation, and the
    error names the field (``... - at `$.temperature```).

    Penalties follow transformers (``repetition_penalty``, over prompt and generated tokens)
    and OpenAI (``presence_penalty`` / ``frequency_penalty``, over generated tokens only).
    ``top_k == 0`` and ``top_p == 1`` disable those filters; ``temperature == 0`` is greedy.
    ``max_tokens`` is checked against the model's context length by the engine.
    """

    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 128
    temperature: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.0
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 1.0
    top_k: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    stop: Annotated[list[StopString], msgspec.Meta(max_length=16)] = msgspec.field(default_factory=list)
    stop_token_ids: Annotated[list[TokenId], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    ignore_eos: bool = False
    presence_penalty: Annotated[float, msgspec.Meta(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, msgspec.Meta(ge=-2, le=2)] = 0.0
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0, le=10)] = 1.0
    # What the text must be (a JSON schema, a regex, ...): the engine constrains decoding to
    # it. Travels with the sampling so every path to an engine carries it (as vLLM's
    # structured outputs do); a semantic call sets it from its output parameter's ``format``.
    format: OutputFormat | None = None
    # The text is a tool answer (an OpenAI request with tools) in the tool syntax named
    # (wire/tool_syntax.py): a call its list already holds ends the list, and the
    # generation (issue 36: a small model asked for calls repeats its one call until
    # max_tokens).
    tool_answer: bool = False
    tool_syntax: Literal["generic", "hermes", "qwen3_xml", "llama3_json", "mistral", "mistral_v11"] = (
        "generic"
    )

    @property
    def is_greedy(self) -> bool:
        """True when the token is the argmax of the penalised logits (no random draw)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
