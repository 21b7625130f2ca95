"""Tool calling for models whose chat template has no tool syntax: Parrot's generic format.

The bundled models (SmolLM2) have no tool syntax in their chat templates, so tools travel
in the prompt and the answer is constrained, as llama.cpp's server does for such templates:

- **The tools**: a block appended to the system message (a system message is added when
  the chat has none) that lists each tool as one line of JSON ``{"name", "description",
  "parameters"}`` and says how to answer (:meth:`ToolPlan.instructions`).
- **The answer** is one JSON object, constrained by a JSON schema
  (:meth:`ToolPlan.output_format`): ``{"tool_calls": [{"name": ..., "arguments": {...}}]}``
  (each item one of the tools with its parameter schema, which allows only the declared
  arguments unless it sets ``additionalProperties``; one item when parallel calls are off)
  or ``{"response": "..."}`` (text for the user). ``tool_choice: "required"`` allows only
  the first, a named function only a call of it, ``"none"`` neither: the tools are not
  listed and the answer is free text. The JSON is compact (no whitespace between tokens),
  as the engine constrains it and as the prompt shows it.
- **The history**: an assistant turn with ``tool_calls`` is rendered as the JSON it would
  have answered, and tool results as a user turn of ``{"tool_response": {"name", "id",
  "content"}}`` lines (one per result), so a tool loop runs over any template.

Pure Python on the wire types: the servers (both OpenAI fronts) and the LangChain adapter
use the same rendering, schema and parsing. Errors are ``ValueError`` s that name the field.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from parrot.wire.chat import ChatTurn
from parrot.wire.formats import OutputFormat
from parrot.wire.openai_schemas import FunctionCall, FunctionDefinition, ToolCall, ToolChoice

NO_ARGUMENTS: Final[dict[str, Any]] = {"type": "object", "properties": {}, "additionalProperties": False}
# JSON in prompts is compact, as the engine constrains answers to be (no free whitespace).
COMPACT: Final = {"ensure_ascii": False, "separators": (",", ":")}
RESPONSE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"response": {"type": "string"}},
    "required": ["response"],
    "additionalProperties": False,
}


def new_call_id() -> str:
    """A tool call's id, as OpenAI makes them: ``call_`` and random characters."""
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolPlan:
    """What a request with tools asks of the model: which ``tools`` it may call, whether it
    must (``required``), and at most one call (``parallel`` off). ``function`` names the
    one tool a named ``tool_choice`` forces. Build it with :func:`plan_tools`."""

    tools: tuple[FunctionDefinition, ...]
    required: bool = False
    function: str | None = None
    parallel: bool = True

    def callable_tools(self) -> tuple[FunctionDefinition, ...]:
        if self.function is None:
            return self.tools
        return tuple(t for t in self.tools if t.name == self.function)

    def instructions(self) -> str:
        """The block of the system message that lists the tools and says how to answer."""
        listed = "\n".join(
            json.dumps(
                {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.parameters or NO_ARGUMENTS,
                },
                **COMPACT,
            )
            for t in self.tools
        )
        call = '{"tool_calls":[{"name":"<tool name>","arguments":{<the arguments>}}]}'
        if self.function is not None:
            call = call.replace("<tool name>", self.function)
        many = " (several calls in the list run together)" if self.parallel else " (one call at a time)"
        lines = [
            "You can call these tools. Each line is a tool: its name, what it does and the JSON schema "
            "of its arguments.",
            listed,
            "",
        ]
        if self.function is not None:
            lines.append(f"Answer with this JSON object, which calls the tool {self.function}:\n{call}")
        elif self.required:
            lines.append(f"Answer with this JSON object, which calls tools{many}:\n{call}")
        else:
            lines += [
                "Answer with one JSON object: to call tools" + many + ",",
                call,
                "or, to answer the user directly,",
                '{"response":"<your answer>"}',
            ]
        lines.append("The results of tool calls come back to you in a later message.")
        return "\n".join(lines)

    def answer_schema(self) -> dict[str, Any]:
        """The JSON schema of an answer (see the module's docstring)."""
        defs: dict[str, Any] = {}
        items = [call_schema(t, i, defs) for i, t in enumerate(self.tools) if t in self.callable_tools()]
        calls: dict[str, Any] = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}}
        calls["minItems"] = 1
        if not self.parallel:
            calls["maxItems"] = 1
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {"tool_calls": calls},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        if not self.required and self.function is None:
            schema = {"anyOf": [schema, copy.deepcopy(RESPONSE_SCHEMA)]}
        if defs:
            schema["$defs"] = defs
        return schema

    def output_format(self) -> OutputFormat:
        """The constraint of the answer's decoding."""
        return OutputFormat(json_schema=self.answer_schema())


def plan_tools(
    tools: Sequence[FunctionDefinition] | None, tool_choice: ToolChoice | None, parallel: bool = True
) -> ToolPlan | None:
    """The plan of a request's ``tools`` and ``tool_choice`` (ValueError: they do not fit
    together). None when no tool may be called (no tools, or ``tool_choice: "none"``)."""
    if not tools:
        if tool_choice is not None:
            raise ValueError("tool_choice needs tools: this request has none")
        return None
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"tools: each function name must be unique; {twice} is given more than once")
    for index, tool in enumerate(tools):
        check_parameters(tool, index)
    if tool_choice == "none":
        return None
    if tool_choice is None or isinstance(tool_choice, str):
        return ToolPlan(tuple(tools), required=tool_choice == "required", parallel=parallel)
    name = tool_choice.function.name
    if name not in names:
        raise ValueError(f"tool_choice names the function {name!r}, which is not in tools ({names})")
    return ToolPlan(tuple(tools), required=True, function=name, parallel=False)


def check_parameters(tool: FunctionDefinition, index: int) -> None:
    """A tool's parameters describe a JSON object (its arguments)."""
    kind = (tool.parameters or {}).get("type", "object")
    if kind != "object":
        raise ValueError(
            f"tools[{index}].function.parameters must be the JSON schema of an object, not of type {kind!r}"
        )


def call_schema(
    tool: FunctionDefinition, index: int, defs: dict[str, Any], arguments_key: str = "arguments"
) -> dict[str, Any]:
    """The schema of one call of ``tool`` (``{"name", arguments_key}``): its arguments are
    the declared ones (unless its schema sets ``additionalProperties``); a parameter schema
    with references of its own moves to ``defs`` (its references rewritten), since it is no
    longer the root."""
    parameters = tool.parameters or copy.deepcopy(NO_ARGUMENTS)
    if "additionalProperties" not in parameters:  # only the declared arguments
        parameters = {**parameters, "additionalProperties": False}
    if _has_refs(parameters):
        prefix = f"tool{index}_"
        moved = copy.deepcopy(parameters)
        for key in ("$defs", "definitions"):
            for name, sub in moved.pop(key, {}).items():
                defs[prefix + name] = _rewrite_refs(sub, prefix)
        defs[prefix + "root"] = _rewrite_refs(moved, prefix)
        parameters = {"$ref": f"#/$defs/{prefix}root"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _has_refs(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_has_refs(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_refs(v) for v in schema)
    return False


def _rewrite_refs(schema: Any, prefix: str) -> Any:
    if isinstance(schema, list):
        return [_rewrite_refs(v, prefix) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rewrite_refs(v, prefix) for k, v in schema.items()}
    ref = out.get("$ref")
    if isinstance(ref, str):
        if ref == "#":
            out["$ref"] = f"#/$defs/{prefix}root"
        for base in ("#/$defs/", "#/definitions/"):
            if ref.startswith(base):
                out["$ref"] = f"#/$defs/{prefix}{ref[len(base) :]}"
    return out


def render_turns(turns: Sequence[ChatTurn], plan: ToolPlan | None) -> list[ChatTurn]:
    """The chat as plain turns for any chat template: the tools' block in the system
    message (with a plan), assistant calls and tool results in the generic format."""
    names = {c.id: c.function.name for t in turns for c in (t.tool_calls or ())}
    out: list[ChatTurn] = []
    results: list[str] = []
    for turn in turns:
        if turn.role == "tool":
            response = {"name": turn.name or names.get(turn.tool_call_id or ""), "id": turn.tool_call_id}
            results.append(json.dumps({"tool_response": {**response, "content": turn.content}}, **COMPACT))
            continue
        if results:
            out.append(ChatTurn(role="user", content="\n".join(results)))
            results = []
        if turn.tool_calls:
            calls = json.dumps({"tool_calls": [_call_json(c) for c in turn.tool_calls]}, **COMPACT)
            out.append(
                ChatTurn(role=turn.role, content=f"{turn.content}\n{calls}" if turn.content else calls)
            )
        else:
            out.append(ChatTurn(role=turn.role, content=turn.content))
    if results:
        out.append(ChatTurn(role="user", content="\n".join(results)))
    if plan is not None:
        if out and out[0].role == "system":
            out[0] = ChatTurn(role="system", content=f"{out[0].content}\n\n{plan.instructions()}")
        else:
            out.insert(0, ChatTurn(role="system", content=plan.instructions()))
    return out


def _call_json(call: ToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        arguments = call.function.arguments
    return {"name": call.function.name, "arguments": arguments}


@dataclass(frozen=True)
class ToolAnswer:
    """An answer in the generic format: tool calls, or text for the user (``content``)."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()


def parse_answer(text: str) -> ToolAnswer | None:
    """The calls or the response of an answer; None when ``text`` is not an answer in the
    generic format (cut off by ``max_tokens``, or generated without the constraint)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("tool_calls"), list):
        calls = [call_of(item) for item in value["tool_calls"]]
        if not calls or None in calls:
            return None
        return ToolAnswer(None, tuple(calls))
    if "response" in value:
        response = value["response"]
        return ToolAnswer(response if isinstance(response, str) else json.dumps(response, ensure_ascii=False))
    return None


def call_of(item: Any) -> ToolCall | None:
    """The call of one item of an answer's ``tool_calls`` (None: not a call), with a new id."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, **COMPACT)
    return ToolCall(id=new_call_id(), function=FunctionCall(name=item["name"], arguments=text))
