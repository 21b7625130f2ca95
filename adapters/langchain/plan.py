"""Reading an LCEL chain into a plan: what :func:`compile_chain` maps onto semantic calls,
what it runs on the client, and what it refuses (:class:`CompileError`, at compile time).

Mapped (run on the server as semantic calls, or on their markers without waiting):
``RunnableSequence``, ``RunnableParallel`` (and the dict shorthand),
``RunnablePassthrough`` and ``.assign``, ``itemgetter`` / ``.pick``, ``PromptTemplate``
and ``ChatPromptTemplate`` (f-string templates with plain ``{name}`` placeholders),
``ParrotLLM`` and ``ParrotChatModel`` (also ``.bind(stop=..., max_tokens=...)``, and
``.with_structured_output(schema)``: its output is a typed variable, and ``itemgetter`` /
``attrgetter`` of its fields formatted into a later prompt are read on the server, as
``{{city.name}}``) and ``StrOutputParser``.

Run on the client, between server stages (their input is waited for, then they run as
LangChain runs them): ``RunnableLambda`` functions, retrievers, other output parsers and
``RunnablePassthrough(func)``.

Refused: models other than Parrot's, other prompt templates and template formats, and any
other runnable (branches, fallbacks, retries, ...).
"""

from __future__ import annotations

import operator
import string
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.language_models import BaseLanguageModel, chat_models
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import (
    BaseOutputParser,
    JsonOutputParser,
    PydanticOutputParser,
    StrOutputParser,
)
from langchain_core.prompts import (
    AIMessagePromptTemplate,
    ChatMessagePromptTemplate,
    ChatPromptTemplate,
    HumanMessagePromptTemplate,
    MessagesPlaceholder,
    PromptTemplate,
    SystemMessagePromptTemplate,
)
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import (
    Runnable,
    RunnableBinding,
    RunnableLambda,
    RunnableParallel,
    RunnablePassthrough,
    RunnablePick,
    RunnableSequence,
)
from langchain_core.runnables.passthrough import RunnableAssign

from parrot.adapters.langchain.chat_model import ParrotChatModel
from parrot.adapters.langchain.llm import ParrotLLM
from parrot.adapters.langchain.structured import output_format
from parrot.adapters.langchain.tool_calling import TOOL_ARGS

MESSAGE_TEMPLATES = (
    SystemMessagePromptTemplate,
    HumanMessagePromptTemplate,
    AIMessagePromptTemplate,
    ChatMessagePromptTemplate,
)
# ``.bind()``'s results: a chat model's is a subclass that only types its streams.
BINDINGS = (RunnableBinding, getattr(chat_models, "_ChatModelBinding", RunnableBinding))
ON_CLIENT_HINT = (
    "to run it on the client between server stages instead, wrap it: RunnableLambda(lambda x: step.invoke(x))"
)


class CompileError(ValueError):
    """A chain that :func:`compile_chain` cannot map; the message says which step, why,
    and what to change."""


@dataclass(frozen=True)
class Series:
    steps: tuple[Step, ...]  # in order


@dataclass(frozen=True)
class Parallel:
    branches: tuple[tuple[str, Step], ...]


@dataclass(frozen=True)
class Assign:
    """``RunnablePassthrough.assign``: the input dict with the branches' outputs added."""

    parallel: Parallel


@dataclass(frozen=True)
class Passthrough:
    pass


@dataclass(frozen=True)
class Local:
    """A LangChain runnable that only moves strings around: run on the markers, nothing
    waits. ``kind``: ``template`` (a prompt template: formats its values), ``getter``
    (``itemgetter``, ``.pick``: looks into a dict) or ``parser`` (``StrOutputParser``)."""

    runnable: Runnable
    kind: Literal["template", "getter", "parser"]


@dataclass(frozen=True)
class ModelCall:
    model: ParrotLLM | ParrotChatModel
    sampling: dict[str, Any]


@dataclass(frozen=True)
class StructuredCall:
    """A model step with a JSON format and the parser after it (``with_structured_output``):
    its output is a typed variable, whose fields later steps read on the server."""

    call: ModelCall
    parser: BaseOutputParser


@dataclass(frozen=True)
class OnClient:
    """Runs in this process on the real values (waited for first)."""

    runnable: Runnable


Step = Series | Parallel | Assign | Passthrough | Local | ModelCall | StructuredCall | OnClient


@dataclass
class Plan:
    root: Step
    models: list[ParrotLLM | ParrotChatModel]


def plan_chain(chain: Runnable) -> Plan:
    models: list[ParrotLLM | ParrotChatModel] = []
    return Plan(_step(chain, "the chain", models), models)


def _step(runnable: Any, where: str, models: list) -> Step:
    if isinstance(runnable, RunnableSequence):
        steps = [_step(s, f"step {i} of {where}", models) for i, s in enumerate(runnable.steps, 1)]
        return Series(_structured(steps))
    if isinstance(runnable, RunnableParallel):
        return _parallel(runnable, where, models)
    if isinstance(runnable, RunnableAssign):
        return Assign(_parallel(runnable.mapper, f"the .assign() of {where}", models))
    if isinstance(runnable, ParrotLLM | ParrotChatModel):
        models.append(runnable)
        return ModelCall(runnable, runnable.sampling())
    if type(runnable) in BINDINGS:
        return _binding(runnable, where, models)
    if type(runnable) is PromptTemplate:
        _check_template(runnable, where)
        return Local(runnable, "template")
    if type(runnable) is ChatPromptTemplate:
        _check_chat_template(runnable, where)
        return Local(runnable, "template")
    if type(runnable) is StrOutputParser:
        return Local(runnable, "parser")
    if type(runnable) is RunnablePick:
        return Local(runnable, "getter")
    if isinstance(runnable, RunnableLambda) and isinstance(
        getattr(runnable, "func", None), operator.itemgetter | operator.attrgetter
    ):
        return Local(runnable, "getter")
    if type(runnable) is RunnablePassthrough:
        if runnable.func is None and runnable.afunc is None:
            return Passthrough()
        return OnClient(runnable)
    if isinstance(runnable, RunnableLambda | BaseRetriever | BaseOutputParser):
        return OnClient(runnable)
    return _refuse(runnable, where)


def _structured(steps: list[Step]) -> tuple[Step, ...]:
    """Each model step with a JSON format followed by a JSON parser, as one step."""
    fused: list[Step] = []
    for step in steps:
        previous = fused[-1] if fused else None
        if (
            isinstance(step, OnClient)
            and type(step.runnable) in (JsonOutputParser, PydanticOutputParser)
            and isinstance(previous, ModelCall)
            and _is_json(previous.sampling.get("format"))
        ):
            fused[-1] = StructuredCall(previous, step.runnable)
        else:
            fused.append(step)
    return tuple(fused)


def _is_json(format: dict | None) -> bool:
    return format is not None and ("json_schema" in format or bool(format.get("json_object")))


def _parallel(runnable: RunnableParallel, where: str, models: list) -> Parallel:
    return Parallel(
        tuple((key, _step(r, f"branch {key!r} of {where}", models)) for key, r in runnable.steps__.items())
    )


def _binding(binding: RunnableBinding, where: str, models: list) -> Step:
    """``model.bind(stop=..., max_tokens=...)``: sampling for that model; a
    ``response_format`` (``with_structured_output``) is the format of the call's output,
    a typed variable; a binding of anything else may only carry configuration."""
    bound, kwargs = binding.bound, dict(binding.kwargs)
    if isinstance(bound, ParrotLLM | ParrotChatModel):
        kwargs.pop("ls_structured_output_format", None)  # LangChain's tracing metadata
        tools = sorted(k for k in TOOL_ARGS if k in kwargs)
        if tools:
            raise CompileError(
                f"{where} binds {tools}: a model that calls tools is not mapped onto a semantic "
                f"call (its answer decides what runs next); {ON_CLIENT_HINT}"
            )
        try:
            typed = output_format(kwargs.pop("response_format", None))
            sampling = bound.sampling(kwargs.pop("stop", None), kwargs)
        except ValueError as error:
            raise CompileError(f"{where}: {error}") from None
        models.append(bound)
        return ModelCall(bound, sampling if typed is None else sampling | {"format": typed})
    if kwargs:
        raise CompileError(
            f"{where} binds arguments {sorted(kwargs)} to {_name(bound)}; only Parrot models take "
            f"bound arguments (sampling settings) in a compiled chain. {ON_CLIENT_HINT}"
        )
    return _step(bound, where, models)


def _check_template(prompt: PromptTemplate, where: str) -> None:
    if prompt.template_format != "f-string":
        raise CompileError(
            f"{where} is a {prompt.template_format} PromptTemplate: such templates can test and "
            "transform their values, which do not exist until the server generates them. Write it "
            f"as an f-string template (the default), or {ON_CLIENT_HINT}"
        )
    for _, field, spec, conversion in string.Formatter().parse(prompt.template):
        if field is None:
            continue
        shown = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if spec or conversion:  # (LangChain itself refuses "{a.b}" and "{a[0]}")
            raise CompileError(
                f"{where}: the placeholder {shown} formats its value; only plain "
                "{name} placeholders map to semantic variables. Prepare the value in an earlier "
                f"step and use a plain placeholder, or {ON_CLIENT_HINT}"
            )


def _check_chat_template(prompt: ChatPromptTemplate, where: str) -> None:
    for n, message in enumerate(prompt.messages, 1):
        at = f"message {n} of {where}"
        if isinstance(message, BaseMessage | MessagesPlaceholder):
            continue
        if not isinstance(message, MESSAGE_TEMPLATES):
            raise CompileError(
                f"{at} is a {_name(message)}, which compile_chain does not map. {ON_CLIENT_HINT}"
            )
        parts = message.prompt if isinstance(message.prompt, list) else [message.prompt]
        for part in parts:
            if type(part) is not PromptTemplate:
                raise CompileError(
                    f"{at} has a {_name(part)} part; a Parrot chat model takes text only, so "
                    "compile_chain maps text templates only"
                )
            _check_template(part, at)


def _refuse(runnable: Any, where: str) -> Step:
    if isinstance(runnable, BaseLanguageModel):
        raise CompileError(
            f"{where} is {_name(runnable)}, not a Parrot model: compile_chain runs every model of "
            "the chain on the Parrot server. Use ParrotLLM or ParrotChatModel (base_url=...) "
            "instead, or run this model outside the compiled chain"
        )
    raise CompileError(
        f"{where} is a {_name(runnable)}, which compile_chain does not map onto semantic calls "
        "(it maps sequences, parallel maps, passthrough/assign, itemgetter, PromptTemplate, "
        "ChatPromptTemplate, Parrot models and StrOutputParser; functions, retrievers and other "
        "output parsers run on the client). Compile the parts before and after it separately, "
        f"or {ON_CLIENT_HINT}"
    )


def _name(obj: Any) -> str:
    return type(obj).__name__
