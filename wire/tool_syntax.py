"""How a model is asked for tool calls and how it writes them: its *tool syntax* (issue 36).

Models trained for tools call them far more accurately in their own syntax, the one their
chat template renders tools and past calls in. Parrot recognises the template (by the
markers it writes) and then:

- renders the chat with the template itself: the tools go to it as ``tools`` (OpenAI's
  function tools), assistant turns keep their ``tool_calls`` (arguments as objects) and tool
  results stay ``tool`` turns, so the prompt is what the model was trained on;
- constrains the answer to the model's own call syntax: an llguidance Lark grammar with the
  JSON schema of each callable tool's call inside (``%json``), written as the template
  writes calls (``", "`` and ``": "`` between JSON items);
- reads the answer back into OpenAI ``tool_calls`` (:mod:`parrot.wire.tool_readers`).

The syntaxes:

- ``hermes`` (Qwen2.5, Qwen3, Hermes 2 Pro / 3): ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>``, one block per call, text allowed before the first;
- ``qwen3_xml`` (Qwen3-Coder, Qwen3.5): ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\n
  value\\n</parameter>\\n...</function>\\n</tool_call>``, values as text (strings as they
  are, other types as JSON), read back by the tools' schemas;
- ``llama3_json`` (Llama 3.1, 3.2, 3.3): the whole answer is one ``{"name": ..., "parameters":
  {...}}``, or text;
- ``mistral`` (Mistral 7B v0.3, Nemo): ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``,
  or text;
- ``mistral_v11`` (Mistral Small 3.1+, Devstral, Ministral 3): ``[TOOL_CALLS]name[ARGS]{...}``
  per call, or text;
- ``generic``: Parrot's own format for every other template (:mod:`parrot.wire.tool_calls`),
  also chosen explicitly (``--tool-format generic``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from parrot.wire.chat import ChatTurn
from parrot.wire.formats import OutputFormat
from parrot.wire.hermes_answers import TaggedOrBareReader
from parrot.wire.tool_calls import NO_ARGUMENTS, ToolAnswer, ToolPlan, call_schema, render_turns
from parrot.wire.tool_readers import (
    JsonCallReader,
    NamedCallsReader,
    PrefixedListReader,
    TaggedCallReader,
    XmlCallReader,
)
from parrot.wire.tool_stream import AnswerStream, read_answer

TOOL_FORMATS: Final = ("auto", "generic")  # --tool-format: the template's syntax, or Parrot's
# The JSON of a call as chat templates write it (``tojson``): one space after separators.
TEMPLATE_JSON: Final[dict[str, Any]] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": True,  # keywords the grammar cannot enforce are left to the tool (as llama.cpp)
    "coerce_one_of": True,
}
# A call as the model lays it out itself (in a code fence: any whitespace between tokens).
FLEXIBLE_JSON: Final[dict[str, Any]] = {"whitespace_flexible": True, "lenient": True, "coerce_one_of": True}


@dataclass(frozen=True)
class Rendering:
    """A chat ready for the model's template: its messages (dicts, as templates read them)
    and the tools to give it (None: the template gets none)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


class ToolSyntax:
    """Parrot's generic format: tools and tool turns rewritten into plain turns, the answer
    a JSON object (:mod:`parrot.wire.tool_calls`)."""

    name = "generic"
    closing = "]}"  # closes an answer cut after its last call (a call that came again)

    def render(self, turns: Sequence[ChatTurn], plan: ToolPlan | None) -> Rendering:
        return Rendering([{"role": t.role, "content": t.content} for t in render_turns(turns, plan)])

    def bound(self, plan: ToolPlan | None) -> ToolSyntax:
        """This syntax for the answers to a request with ``plan`` (a syntax whose reader
        needs the tools' schemas takes them here; the others are the same for all)."""
        return self

    def output_format(self, plan: ToolPlan) -> OutputFormat:
        return plan.output_format()

    def reader(
        self,
    ) -> AnswerStream | TaggedCallReader | TaggedOrBareReader | JsonCallReader | PrefixedListReader:
        """A reader of one answer as it streams (``feed``, ``finish``)."""
        return AnswerStream()

    def read(self, text: str) -> tuple[ToolAnswer, bool]:
        """A whole answer read as its stream would be: its calls or content, and whether it
        is a complete list of calls (``finish_reason: "tool_calls"``)."""
        return read_answer(text)


class NativeSyntax(ToolSyntax):
    """A model's own syntax: the chat rendered by its template with ``tools``."""

    closing = ""  # calls are whole where an answer is cut
    markers: tuple[str, ...] = ()  # all in a template that writes calls this way
    arguments_key = "arguments"

    def detects(self, template: str) -> bool:
        return all(marker in template for marker in self.markers)

    def render(self, turns: Sequence[ChatTurn], plan: ToolPlan | None) -> Rendering:
        names = {c.id: c.function.name for t in turns for c in (t.tool_calls or ())}
        messages = [_template_message(t, names) for t in turns]
        tools = None if plan is None else [_template_tool(t) for t in plan.tools]
        return Rendering(messages, tools)

    def call_schema(self, plan: ToolPlan) -> dict[str, Any]:
        """The JSON schema of one call: any callable tool with its arguments."""
        defs: dict[str, Any] = {}
        items = [call_schema(t, i, defs, self.arguments_key) for i, t in enumerate(plan.callable_tools())]
        schema: dict[str, Any] = items[0] if len(items) == 1 else {"anyOf": items}
        if defs:
            schema = {**schema, "$defs": defs}
        return {**schema, "x-guidance": TEMPLATE_JSON}

    def read(self, text: str) -> tuple[ToolAnswer, bool]:
        reader = self.reader()
        first, rest = reader.feed(text), reader.finish()
        calls = (*first.tool_calls, *rest.tool_calls)
        content = (first.content or "") + (rest.content or "")
        if calls:  # the text before calls, as OpenAI gives it beside them
            content = content.strip()
        return ToolAnswer(content or None, calls), reader.called_tools


class HermesSyntax(NativeSyntax):
    name = "hermes"
    markers = ("<tool_call>", '"arguments', "tools")  # JSON in the tags (not XML, as Qwen3-Coder)
    open, close = "<tool_call>\n", "\n</tool_call>"

    def output_format(self, plan: ToolPlan) -> OutputFormat:
        more = "" if not plan.parallel else f' ("\\n" {_lark(self.open)} body)*'
        lines = [f"call: %json {json.dumps(self.call_schema(plan))}", f"body: call {_lark(self.close)}"]
        if plan.required:
            lines.insert(0, f"start: {_lark(self.open)} body{more}")
        else:  # text; or text (possibly none) and then calls, the tag spelled out (LEAD) or
            # the model's own token (a token no text lexeme takes, so TEXT ends before it);
            # or, as the whole answer, one call untagged (what small Qwen models write)
            # or in a JSON code fence, its JSON laid out as the model likes
            start = f"TEXT | LEAD body{more} | TEXT? {_lark(self.open)} body{more} | call | fenced"
            flexible = {**self.call_schema(plan), "x-guidance": FLEXIBLE_JSON}
            lines.insert(0, f"start: {start}")
            lines.append(f'fenced: ("```json\\n" | "```\\n") %json {json.dumps(flexible)} "\\n```"')
            tag, call_first = self.open.strip(), "\\s*(```(json)?\\n\\s*)?\\{(?s:.*)"
            lines.append(f"TEXT: /(?s:.+)/ & ~/(?s:.*{tag}.*)/ & ~/{call_first}/")
            lines.append(f"LEAD: /(?s:.*){tag}\\n/ & ~/(?s:.*{tag}.*{tag}.*)/ & ~/{call_first}/")
        return OutputFormat(grammar="\n".join(lines))

    def reader(self) -> TaggedOrBareReader:
        return TaggedOrBareReader(self.open.strip(), self.close.strip(), self.arguments_key)


class Llama3JsonSyntax(NativeSyntax):
    name = "llama3_json"
    markers = ("ipython", '"parameters"', "tools")
    arguments_key = "parameters"

    def output_format(self, plan: ToolPlan) -> OutputFormat:
        call = f"%json {json.dumps(self.call_schema(plan))}"
        if plan.required:
            return OutputFormat(grammar=f"start: {call}")
        return OutputFormat(grammar=f"start: TEXT | {call}\nTEXT: /[^{{\\s](?s:.*)/")

    def reader(self) -> JsonCallReader:
        return JsonCallReader(self.arguments_key)


class MistralSyntax(NativeSyntax):
    """``[TOOL_CALLS]`` and a JSON list of calls (Mistral 7B v0.3, Nemo, Small before 3.1),
    whose templates want call ids of 9 letters and digits."""

    name = "mistral"
    markers = ("[TOOL_CALLS][", "[AVAILABLE_TOOLS]")
    prefix = "[TOOL_CALLS]"
    closing = "]"  # the list, cut after its last new call

    def render(self, turns: Sequence[ChatTurn], plan: ToolPlan | None) -> Rendering:
        rendering = super().render(turns, plan)
        for message in rendering.messages:
            for call in message.get("tool_calls", ()):
                call["id"] = _short_id(call["id"])
            if message.get("tool_call_id"):
                message["tool_call_id"] = _short_id(message["tool_call_id"])
        return rendering

    def output_format(self, plan: ToolPlan) -> OutputFormat:
        calls: dict[str, Any] = {"type": "array", "items": self.call_schema(plan), "minItems": 1}
        if not plan.parallel or plan.function is not None:
            calls["maxItems"] = 1
        call = f"{_lark(self.prefix)} %json {json.dumps({**calls, 'x-guidance': TEMPLATE_JSON})}"
        if plan.required:
            return OutputFormat(grammar=f"start: {call}")
        text = "TEXT: /(?s:.+)/ & ~/(?s:.*\\[TOOL_CALLS\\].*)/"  # text never holds the marker
        return OutputFormat(grammar=f"start: TEXT | {call}\n{text}")

    def reader(self) -> PrefixedListReader:
        return PrefixedListReader(self.prefix, self.arguments_key)


class MistralNamedSyntax(MistralSyntax):
    """``[TOOL_CALLS]name[ARGS]{...}`` once per call (Mistral Small 3.1+, Devstral, Ministral 3,
    whose tokenizers are v11 and later); their templates too want call ids of 9 characters.
    Small 3.2's template writes a past call's ``[CALL_ID]`` before ``[ARGS]``: the reader takes
    it, the grammar writes calls without it, as the others' templates do."""

    name = "mistral_v11"
    markers = ("[TOOL_CALLS]", "[ARGS]", "[AVAILABLE_TOOLS]")
    closing = ""  # calls are whole where an answer is cut

    def output_format(self, plan: ToolPlan) -> OutputFormat:
        tools = plan.callable_tools()
        lines = [f"call: {_lark(self.prefix)} (" + " | ".join(f"c{i}" for i in range(len(tools))) + ")"]
        for i, tool in enumerate(tools):
            arguments = {**(tool.parameters or NO_ARGUMENTS), "x-guidance": TEMPLATE_JSON}
            arguments.setdefault("additionalProperties", False)  # the declared ones, as call_schema
            lines.append(f"c{i}: {_lark(tool.name)} {_lark('[ARGS]')} %json {json.dumps(arguments)}")
        calls = "call+" if plan.parallel and plan.function is None else "call"
        if plan.required:
            lines.insert(0, f"start: {calls}")
        else:
            lines.insert(0, f"start: TEXT | {calls}")  # text never holds the marker: no calls in content
            lines.append("TEXT: /(?s:.+)/ & ~/(?s:.*\\[TOOL_CALLS\\].*)/")
        return OutputFormat(grammar="\n".join(lines))

    def reader(self) -> NamedCallsReader:
        return NamedCallsReader(self.prefix)


class XmlSyntax(NativeSyntax):
    """``<tool_call>`` blocks with XML inside (Qwen3-Coder, Qwen3.5): ``<function=NAME>``,
    then a ``<parameter=KEY>`` block per argument whose value is text (a string as it is,
    anything else as JSON), one block per call, text allowed before the first. The grammar
    writes each callable tool's arguments in its schema's order, each value by its type
    (a string is any text that does not close its block; an object or list is JSON by its
    schema); the reader reads them back by the same types, so it is bound to the plan."""

    name = "qwen3_xml"
    markers = ("<tool_call>", "<function=", "<parameter=")
    open = "<tool_call>\n"
    close = "</function>\n</tool_call>"
    types: dict[str, dict[str, Any]] | None = None  # tool -> argument -> schema (see bound)

    def bound(self, plan: ToolPlan | None) -> XmlSyntax:
        syntax = XmlSyntax()
        if plan is not None:
            syntax.types = {t.name: _properties(t.parameters) for t in plan.tools}
        return syntax

    def output_format(self, plan: ToolPlan) -> OutputFormat:
        tools = plan.callable_tools()
        lines = ["body: " + " | ".join(f"f{i}" for i in range(len(tools)))]
        for i, tool in enumerate(tools):
            required = set((tool.parameters or {}).get("required", ()))
            parts = [_lark(f"<function={tool.name}>\n")]
            for j, (key, schema) in enumerate(_properties(tool.parameters).items()):
                rule = f"p{i}_{j}"
                value = _xml_value_rule(schema, (tool.parameters or {}).get("$defs"))
                if value == "STR" and isinstance(schema, dict) and {"minLength", "maxLength"} & set(schema):
                    value = f"S{i}_{j}"  # a string of bounded length
                    least, most = schema.get("minLength", 0), schema.get("maxLength", "")
                    lines.append(f"{value}: /(?s:.{{{least},{most}}}){_END_RE}/ & ~/(?s:.*{_END_RE}(?s:.+))/")
                lines.append(f"{rule}: {_lark(f'<parameter={key}>' + chr(10))} {value}")
                parts.append(rule if key in required else f"{rule}?")
            lines.append(f"f{i}: {' '.join(parts)} {_lark(self.close)}")
        if any(line.endswith(" STR") for line in lines):
            lines.append(f"STR: /(?s:.*){_END_RE}/ & ~/(?s:.*{_END_RE}(?s:.+))/")
        more = "" if not plan.parallel or plan.function is not None else f' ("\\n" {_lark(self.open)} body)*'
        if plan.required:
            lines.insert(0, f"start: {_lark(self.open)} body{more}")
        else:  # text, or text (possibly none) and then calls
            lines.insert(0, f"start: TEXT | LEAD body{more} | TEXT? {_lark(self.open)} body{more}")
            lines.append("TEXT: /(?s:.+)/ & ~/(?s:.*<tool_call>.*)/")
            lines.append("LEAD: /(?s:.*)<tool_call>\\n/ & ~/(?s:.*<tool_call>.*<tool_call>.*)/")
        return OutputFormat(grammar="\n".join(lines))

    def reader(self) -> XmlCallReader:
        return XmlCallReader(self.types)


_END = "\n</parameter>\n"  # what closes an argument's value
_END_RE = "\\n<\\/parameter>\\n"


def _properties(parameters: dict[str, Any] | None) -> dict[str, Any]:
    properties = (parameters or {}).get("properties")
    return properties if isinstance(properties, dict) else {}


def _xml_value_rule(schema: Any, defs: Any = None) -> str:
    """The Lark of an argument's value and the block's end: a string's text (one of its
    ``enum`` where it has one), a number or boolean as the template writes it, else JSON."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    end = _lark(_END)
    if kind == "string" and isinstance(schema.get("enum"), list):
        return "(" + " | ".join(_lark(str(v)) for v in schema["enum"]) + f") {end}"
    if kind == "string" or not isinstance(schema, dict):
        return "STR"
    if kind == "boolean":
        return f'("true" | "false" | "True" | "False") {end}'
    schema = {**schema, "$defs": defs} if defs else schema  # what its $ref may name
    return f"%json {json.dumps({**schema, 'x-guidance': TEMPLATE_JSON})} {end}"


GENERIC: Final = ToolSyntax()
NATIVE: Final[tuple[NativeSyntax, ...]] = (
    XmlSyntax(),
    HermesSyntax(),
    Llama3JsonSyntax(),
    MistralNamedSyntax(),
    MistralSyntax(),
)
SYNTAXES: Final[dict[str, ToolSyntax]] = {s.name: s for s in (GENERIC, *NATIVE)}


def syntax_of_template(template: str | None, tool_format: str = "auto") -> ToolSyntax:
    """The syntax a chat template writes calls in (``generic`` when it writes none it is
    known by, or when ``tool_format`` asks for Parrot's own)."""
    if tool_format == "generic" or not template:
        return GENERIC
    return next((s for s in NATIVE if s.detects(template)), GENERIC)


# Marker texts that tool-trained tokenizers hold as one token each: a grammar writes each as
# a literal of its own, which the engine also matches as the model's token where its
# tokenizer has it (parrot.engines.protocol.token_literals), and the engine's text keeps
# them where the tokenizer calls them special (Mistral's).
TOKEN_TEXTS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
_TOKEN_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in TOKEN_TEXTS) + ")")


def _lark(text: str) -> str:
    """``text`` as Lark string literals (JSON's escapes are Lark's), a marker token's text a
    literal of its own: ``"<tool_call>" "\\n"``."""
    return " ".join(json.dumps(piece) for piece in _TOKEN_SPLIT.split(text) if piece) or '""'


def _template_tool(tool) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description or "", "parameters": tool.parameters}
    if function["parameters"] is None:
        function["parameters"] = dict(NO_ARGUMENTS)
    return {"type": "function", "function": function}


def _template_message(turn: ChatTurn, names: dict[str, str]) -> dict[str, Any]:
    """A turn as chat templates read it: calls with their arguments as objects, a tool
    result with the id and name of its call."""
    message: dict[str, Any] = {"role": turn.role, "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in turn.tool_calls
        ]
    if turn.role == "tool":
        message["tool_call_id"] = turn.tool_call_id
        message["name"] = turn.name or names.get(turn.tool_call_id or "", "")
    return message


def _short_id(call_id: str) -> str:
    """A call id as Mistral's templates want it (9 letters and digits), the same for a call
    and its result."""
    return (
        call_id if len(call_id) == 9 and call_id.isalnum() else hashlib.sha1(call_id.encode()).hexdigest()[:9]
    )


def _arguments(text: str | None) -> Any:
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError:
        return text
