"""An output format (issue 21) as an OpenAI-compatible endpoint's structured-output request.

What is sent, by kind of format (chat and completions APIs alike):

============  ==========================================================================
json_schema   ``response_format: {"type": "json_schema", "json_schema": {"name": ...,
              "schema": ..., "strict": true}}`` (OpenAI, vLLM, SGLang, llama.cpp's server,
              Parrot's own ``/v1``); ``name`` is the schema's ``title`` when it is a valid
              name, else ``"output"``
json_object   ``response_format: {"type": "json_object"}`` (the same servers)
regex         ``structured_outputs: {"regex": ...}`` (vLLM) and ``regex`` (SGLang)
choice        ``structured_outputs: {"choice": [...]}`` (vLLM), ``regex``: the escaped
              alternation (SGLang), ``grammar``: a GBNF alternation (llama.cpp's server)
grammar       ``structured_outputs: {"grammar": ...}`` (vLLM) and ``grammar`` prefixed with
              ``%llguidance {}`` (llama.cpp's server built with llguidance, which reads
              this Lark dialect)
============  ==========================================================================

Fields an endpoint does not know are ignored by vLLM, SGLang, llama.cpp and Parrot, and
refused (400) by OpenAI itself, which has no regex, choice or grammar: the call then fails
with the endpoint's reason rather than run unconstrained. Whatever the endpoint does with
the request, the ServeCore checks the value it gets back against the format
(:mod:`parrot.platform.serve.variables.formats`): one that does not match fails its call.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from parrot.engines.protocol.grammar import escape_regex
from parrot.wire.formats import OutputFormat

SCHEMA_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
DEFAULT_NAME: Final = "output"
LLGUIDANCE_PREFIX: Final = "%llguidance {}\n"  # llama.cpp: the grammar is llguidance's Lark


def response_format(fmt: OutputFormat) -> dict[str, Any] | None:
    """The OpenAI ``response_format`` of a JSON format (None for the other kinds)."""
    if fmt.json_object:
        return {"type": "json_object"}
    if fmt.json_schema is None:
        return None
    title = fmt.json_schema.get("title")
    name = title if isinstance(title, str) and SCHEMA_NAME.fullmatch(title) else DEFAULT_NAME
    return {"type": "json_schema", "json_schema": {"name": name, "schema": fmt.json_schema, "strict": True}}


def extra_fields(fmt: OutputFormat) -> dict[str, Any]:
    """Body fields beyond OpenAI's for a regex, choice or grammar (see the module's table)."""
    if fmt.regex is not None:
        return {"structured_outputs": {"regex": fmt.regex}, "regex": fmt.regex}
    if fmt.choice is not None:
        return {
            "structured_outputs": {"choice": list(fmt.choice)},
            "regex": "|".join(f"({escape_regex(c)})" for c in fmt.choice),
            "grammar": "root ::= " + " | ".join(gbnf_literal(c) for c in fmt.choice),
        }
    if fmt.grammar is not None:
        return {"structured_outputs": {"grammar": fmt.grammar}, "grammar": LLGUIDANCE_PREFIX + fmt.grammar}
    return {}


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (JSON's escapes are GBNF's: ``\\"``, ``\\\\``,
    ``\\n``, ``\\uXXXX``)."""
    return json.dumps(text)
