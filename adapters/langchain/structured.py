"""Structured output for ``ParrotChatModel.with_structured_output``: a schema as LangChain
takes it (a pydantic class, a TypedDict, a JSON schema or an OpenAI tool dict) turned
into the OpenAI ``response_format`` bound to the model, and the parser of its answer.

Bound as ``response_format``, the schema reaches Parrot as the output parameter's
``format`` of the model's semantic call (:func:`output_format`), whether the model runs
on its own or in a compiled chain: the server constrains the generation to it and checks
the value, and in a compiled chain the output is a typed variable of the session's DAG.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

from langchain_core.output_parsers import BaseOutputParser, JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema
from pydantic import BaseModel

Method = Literal["json_schema", "json_mode", "function_calling"]
METHODS: tuple[str, ...] = ("json_schema", "json_mode", "function_calling")


@dataclass(frozen=True)
class StructuredSchema:
    """A LangChain schema as JSON: its ``name``, its JSON ``schema``, and its ``model``
    when it is a pydantic class (the parsed value is then an instance of it)."""

    name: str
    schema: dict[str, Any]
    model: type[BaseModel] | None


def structured_schema(schema: Any, strict: bool | None = None) -> StructuredSchema:
    """Read any schema LangChain's ``with_structured_output`` takes; ``strict``: as
    OpenAI's strict mode, every object of the schema is closed (no keys but its own)."""
    found = _read_schema(schema)
    return StructuredSchema(found.name, closed(found.schema), found.model) if strict else found


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that does not say."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _read_schema(schema: Any) -> StructuredSchema:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return StructuredSchema(schema.__name__, schema.model_json_schema(), schema)
    if isinstance(schema, Mapping) and _is_json_schema(schema):
        return StructuredSchema(str(schema.get("title", "output")), dict(schema), None)
    try:
        converted = convert_to_json_schema(schema)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"with_structured_output takes a pydantic class, a TypedDict, a JSON schema or an OpenAI "
            f"tool dict; got {schema!r} ({error})"
        ) from None
    if converted.get("description") == dict.__doc__:  # a TypedDict without a docstring
        del converted["description"]
    return StructuredSchema(str(converted.pop("title", "output")), converted, None)


def _is_json_schema(schema: Mapping[str, Any]) -> bool:
    """A JSON schema (not an OpenAI function or tool dict, which name their parameters)."""
    if "function" in schema or ("name" in schema and "parameters" in schema):
        return False
    return any(key in schema for key in ("type", "properties", "anyOf", "oneOf", "$ref", "enum"))


def response_format(method: Method, found: StructuredSchema | None, strict: bool | None) -> dict[str, Any]:
    """The OpenAI ``response_format`` of a method (``json_mode``: any JSON object)."""
    if method == "json_mode" or found is None:
        return {"type": "json_object"}
    spec: dict[str, Any] = {"name": found.name, "schema": found.schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


def output_format(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An OpenAI ``response_format`` as Parrot's output format (None: free text)."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        if not isinstance(spec.get("schema"), Mapping):
            raise ValueError("response_format json_schema needs json_schema.schema, a JSON schema")
        return {"json_schema": dict(spec["schema"])}
    if kind == "text":
        return None
    raise ValueError(f"response_format type {kind!r}: Parrot takes json_object, json_schema or text")


def parser(method: Method, found: StructuredSchema | None) -> BaseOutputParser:
    """What reads the model's answer into the structured value."""
    if method == "function_calling":
        assert found is not None
        if found.model is not None:
            return PydanticToolsParser(tools=[found.model], first_tool_only=True)
        return JsonOutputKeyToolsParser(key_name=found.name, first_tool_only=True)
    if found is not None and found.model is not None:
        return PydanticOutputParser(pydantic_object=found.model)
    return JsonOutputParser()


def with_raw(model: Runnable, read: BaseOutputParser) -> Runnable:
    """LangChain's ``include_raw=True`` shape: ``{"raw", "parsed", "parsing_error"}``, a
    parsing error returned instead of raised."""
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | read, parsing_error=lambda _: None)
    failed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=model) | parsed.with_fallbacks([failed], exception_key="parsing_error")
