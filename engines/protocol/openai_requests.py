"""An OpenAI request read into Parrot's terms, shared by every server that speaks the OpenAI
API (the builtin engine's ``/v1`` and the ServeCore's front): its sampling (with the output
format of ``response_format`` or of its tools in the model's tool syntax), and a chat's turns
and tool plan (:mod:`parrot.wire.tool_syntax` renders them).

Bad input is a :class:`BadRequestError` (400) whose message names the field. Schemas are
checked against the JSON Schema meta-schema here, so a schema that is not one is named by
its field, and compiled by the grammar library (``bad_format``), as the engine will. No
check fetches anything: jsonschema-rs by default GETs an unknown ``$schema`` or a remote
``$ref`` (a request to any URL a client names), so it is given a registry that refuses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import msgspec

from parrot.engines.protocol.errors import BadFormatError, BadRequestError
from parrot.engines.protocol.grammar import check_grammar, offline_registry, to_grammar
from parrot.wire.chat import ChatTurn
from parrot.wire.formats import MAX_PATTERN_CHARS, OutputFormat
from parrot.wire.openai_schemas import (
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    StructuredOutputs,
    ToolChoice,
    ToolDefinition,
)
from parrot.wire.sampling import SamplingParams
from parrot.wire.tool_calls import ToolPlan, plan_tools
from parrot.wire.tool_syntax import GENERIC, Rendering, ToolSyntax


def check_schema(schema: Any, field: str) -> None:
    """``schema`` is a JSON schema that the grammar library compiles (a 400 naming
    ``field`` otherwise; ``bad_format`` when only the library refuses it)."""
    if not isinstance(schema, dict):
        raise BadRequestError(f"{field} must be a JSON schema (an object)")
    try:
        jsonschema_rs.meta.validate(schema, registry=offline_registry())
    except jsonschema_rs.ValidationError as error:
        raise BadRequestError(f"{field} is not a valid JSON schema: {error.message}") from None
    except jsonschema_rs.ReferencingError as error:
        raise BadRequestError(f"{field} has a reference that cannot be resolved: {error}") from None
    except (ValueError, RecursionError) as error:  # the validator gives up on deep nesting
        raise BadRequestError(f"{field} is nested too deeply to be checked ({error})") from None
    fmt = OutputFormat(json_schema=schema)
    try:
        check_grammar(fmt, to_grammar(fmt))
    except BadFormatError as error:
        raise BadFormatError(f"{field}: {error}") from None


def structured_output(asked: StructuredOutputs) -> OutputFormat:
    """The format of vLLM's ``structured_outputs`` (checked as the engine checks it)."""
    fields = {k: v for k, v in msgspec.to_builtins(asked).items() if v is not None}
    if isinstance(fields.get("json"), str):
        try:
            fields["json"] = json.loads(fields["json"])
        except json.JSONDecodeError as error:
            raise BadRequestError(f"structured_outputs.json is not valid JSON: {error}") from None
    if "json" in fields:
        check_schema(fields["json"], "structured_outputs.json")
        fields["json_schema"] = fields.pop("json")
    try:
        fmt = msgspec.convert(fields, OutputFormat)
    except msgspec.ValidationError as error:
        raise BadRequestError(f"structured_outputs: {error}") from None
    try:
        check_grammar(fmt, to_grammar(fmt))
    except BadFormatError as error:
        raise BadFormatError(f"structured_outputs.{fmt.kind}: {error}") from None
    return fmt


def output_format(req, tools: ToolPlan | None = None, syntax: ToolSyntax = GENERIC) -> OutputFormat | None:
    """What the answer must be: a tool answer in the model's tool ``syntax``, the
    ``response_format`` (``text``: free), or vLLM's ``structured_outputs``."""
    asked = getattr(req, "response_format", None)
    extension = getattr(req, "structured_outputs", None)
    if extension is not None:
        if tools is not None or isinstance(asked, (JsonObjectFormat, JsonSchemaFormat)):
            raise BadRequestError("structured_outputs cannot be combined with response_format or tools")
        return structured_output(extension)
    if tools is not None:
        if isinstance(asked, (JsonObjectFormat, JsonSchemaFormat)):
            raise BadRequestError(
                'response_format cannot be combined with tools (unless tool_choice is "none"): '
                "the answer is a tool call or text"
            )
        return _tool_format(syntax, tools)
    if isinstance(asked, JsonObjectFormat):
        return OutputFormat(json_object=True)
    if isinstance(asked, JsonSchemaFormat):
        check_schema(asked.json_schema.schema, "response_format.json_schema.schema")
        return OutputFormat(json_schema=asked.json_schema.schema)
    return None


def _tool_format(syntax: ToolSyntax, tools: ToolPlan) -> OutputFormat:
    """The constraint of a tool answer; a grammar of the model's syntax carries every
    callable tool's schema, and must fit the wire's bound on a grammar (as a schema fits
    ``--max-format-chars``)."""
    fmt = syntax.output_format(tools)
    if fmt.grammar is not None and len(fmt.grammar) > MAX_PATTERN_CHARS:
        raise BadRequestError(
            f"tools: their schemas make a grammar of {len(fmt.grammar)} characters in the model's "
            f"tool syntax ({syntax.name}), over the limit of {MAX_PATTERN_CHARS}: offer fewer or "
            "smaller tools"
        )
    return fmt


def sampling_params(
    req, default_max_tokens: int, tools: ToolPlan | None = None, syntax: ToolSyntax = GENERIC
) -> SamplingParams:
    """The sampling of an OpenAI completion or chat request (a chat's tool answer in the
    model's tool ``syntax``)."""
    max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens or default_max_tokens
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    fields = {
        "max_tokens": max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": max(0, req.top_k),
        "seed": req.seed,
        "stop": stop,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
        "ignore_eos": req.ignore_eos,
    }
    sampling = msgspec.convert(fields, SamplingParams)
    return msgspec.structs.replace(
        sampling,
        format=output_format(req, tools, syntax),
        tool_answer=tools is not None,
        tool_syntax=syntax.name,
    )


def content_text(content: str | list[dict] | None) -> str:
    """The text of a chat message's content (a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise BadRequestError(f"only text message parts are supported, got {part.get('type')!r}")
        parts.append(str(part.get("text", "")))
    return "".join(parts)


@dataclass(frozen=True)
class Chat:
    """A chat request's turns (with their tool calls and results) and its tool plan (None:
    the answer is not a tool answer)."""

    turns: list[ChatTurn]
    tools: ToolPlan | None

    def render(self, syntax: ToolSyntax) -> Rendering:
        """The chat for a template that writes calls in ``syntax``."""
        return syntax.render(self.turns, self.tools)


def read_chat(req: ChatCompletionRequest) -> Chat:
    """The turns of a chat request and its tool plan, checked."""
    turns = []
    called: set[str] = set()  # ids of the tool calls of earlier assistant messages
    for index, message in enumerate(req.messages):
        if message.role == "tool" and not message.tool_call_id:
            raise BadRequestError(f'messages[{index}]: a message with role "tool" needs a tool_call_id')
        if message.role == "tool" and message.tool_call_id not in called:
            raise BadRequestError(  # as OpenAI answers: a result must follow its call
                f"messages[{index}]: tool_call_id {message.tool_call_id!r} answers no tool call "
                "of an earlier assistant message"
            )
        if message.tool_calls and message.role != "assistant":
            raise BadRequestError(f"messages[{index}]: only an assistant message has tool_calls")
        called.update(call.id for call in message.tool_calls or ())
        turns.append(
            ChatTurn(
                role=message.role,
                content=content_text(message.content),
                tool_calls=message.tool_calls or None,
                tool_call_id=message.tool_call_id,
                name=message.name,
            )
        )
    return Chat(turns, read_tools(req.tools, req.tool_choice, req.parallel_tool_calls))


def read_tools(
    tools: list[ToolDefinition] | None,
    tool_choice: ToolChoice | None,
    parallel: bool,
    check_schemas: bool = True,
) -> ToolPlan | None:
    """The tool plan of a request's tool fields, its schemas checked (``check_schemas``
    False: by whoever sent them on, as the ServeCore did before it asks an engine to
    render the chat)."""
    functions = [t.function for t in tools or ()]
    for index, tool in enumerate(functions if check_schemas else ()):
        if tool.parameters is not None:
            check_schema(tool.parameters, f"tools[{index}].function.parameters")
    try:
        return plan_tools(functions, tool_choice, parallel)
    except ValueError as error:
        raise BadRequestError(str(error)) from None
