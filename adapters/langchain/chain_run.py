"""Running a compiled chain's plan for one input, in a :class:`SessionRun`.

The input's strings become slots of the run (each LangChain variable one semantic
variable), and the plan runs on values that hold markers instead of texts: LangChain's own
prompt templates, item getters and ``StrOutputParser`` run on them as they are (nothing
waits), and each model step submits a semantic call whose inputs are the slots in its
prompt and whose output is a new slot. Parallel branches run concurrently, so every call
of the chain is submitted before anything is waited for. Only a step that runs on the
client waits, for the texts its input holds; at the end the texts in the chain's output,
and only those, are fetched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, convert_to_messages
from langchain_core.prompt_values import ChatPromptValue, PromptValue, StringPromptValue
from langchain_core.runnables import Runnable, RunnableConfig

from parrot.adapters.langchain.chat_model import ParrotChatModel
from parrot.adapters.langchain.model_calls import (
    call_metadata,
    call_usage_metadata,
    submit_chat,
    submit_completion,
)
from parrot.adapters.langchain.plan import (
    Assign,
    Local,
    ModelCall,
    OnClient,
    Parallel,
    Passthrough,
    Series,
    Step,
    StructuredCall,
)
from parrot.adapters.langchain.session_run import SessionRun
from parrot.adapters.langchain.texts import Structured, TextSlot

# How a step that runs on the client is run: (runnable, its input, the run's config).
ClientRunner = Callable[[Runnable, Any, RunnableConfig], Awaitable[Any]]
LOCAL_CONFIG: RunnableConfig = {"callbacks": None}  # runs on markers are not traced
CALL_KEY = "parrot_call_id"


class ChainRun:
    def __init__(
        self,
        run: SessionRun,
        config: RunnableConfig,
        criteria: str,
        wait_timeout: float,
        on_client: ClientRunner,
    ) -> None:
        self.run = run
        self.texts = run.texts
        self.config = config
        self.criteria = criteria
        self.wait_timeout = wait_timeout
        self.on_client = on_client

    async def output(self, root: Step, value: Any) -> Any:
        """The chain's output for ``value``: what the uncompiled chain returns."""
        return await self.materialize(await self.step(root, self._marked(value), "output"))

    def _marked(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.texts.known("input", value)
        if isinstance(value, dict):
            return {k: self.texts.known(str(k), v) if isinstance(v, str) else v for k, v in value.items()}
        return value

    async def step(self, step: Step, value: Any, name: str) -> Any:
        """Run ``step`` on ``value``; ``name`` names the outputs it generates."""
        match step:
            case Series(steps):
                for inner in steps:
                    value = await self.step(inner, value, name)
                return value
            case Parallel():
                return await self._parallel(step, value)
            case Assign(parallel):
                if not isinstance(value, dict):
                    kind = type(value).__name__
                    raise ValueError(f"the input of RunnablePassthrough.assign() must be a dict, not {kind}")
                return {**value, **await self._parallel(parallel, value)}
            case Passthrough():
                return value
            case Local(runnable, "template"):
                return runnable.invoke(await self._formattable(value, runnable.input_variables), LOCAL_CONFIG)
            case Local(runnable, "getter"):
                return runnable.invoke(await self._indexable(value), LOCAL_CONFIG)
            case Local(runnable):  # StrOutputParser: a string or a message's text, as it is
                return runnable.invoke(value, LOCAL_CONFIG)
            case ModelCall():
                return await self._model_call(step, value, name)
            case StructuredCall(call, parser):
                slot, _ = await self._submit(call, value, name)
                schema = call.sampling["format"].get("json_schema", {})
                return Structured(self.texts, slot, lambda text: parser.invoke(text, LOCAL_CONFIG), schema)
            case OnClient(runnable):
                return await self.on_client(runnable, await self.materialize(value), self.config)
        raise TypeError(f"not a step: {step!r}")

    async def _parallel(self, parallel: Parallel, value: Any) -> dict[str, Any]:
        """The branches concurrently; the first to fail cancels the others and its error is
        raised as it is (as LangChain raises it)."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = {key: group.create_task(self.step(s, value, key)) for key, s in parallel.branches}
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return {key: task.result() for key, task in tasks.items()}

    async def _formattable(self, value: Any, used: Sequence[str]) -> Any:
        """A prompt template's input: strings stay (a marker is formatted as it is); any
        other value that holds texts of the run and that the template formats (a name in
        ``used``) is waited for, since the template formats it (``str()``) as the
        uncompiled chain would."""
        if isinstance(value, dict):
            keep = [k for k, v in value.items() if k not in used or _formats_as_marker(v)]
            return {k: v if k in keep else await self.materialize(v) for k, v in value.items()}
        return value if isinstance(value, str) else await self.materialize(value)

    async def _indexable(self, value: Any) -> Any:
        """A getter's input: a dict or a structured value is looked into as it is (a field
        of a structured value is read on the server); a string would be cut by position,
        so it needs its real text."""
        return value if isinstance(value, dict | Structured) else await self.materialize(value)

    async def _submit(self, step: ModelCall, value: Any, name: str) -> tuple[TextSlot, str | None]:
        """The model step's call; its output's slot and (for a chat) the model it ran on."""
        prompt = _prompt_value(value)
        if isinstance(step.model, ParrotChatModel):
            return await submit_chat(self.run, prompt.to_messages(), name, step.sampling, step.model.model)
        models = step.model.models()
        return await submit_completion(self.run, prompt.to_string(), name, step.sampling, models), None

    async def _model_call(self, step: ModelCall, value: Any, name: str) -> Any:
        slot, model = await self._submit(step, value, name)
        if model is None:
            return self.texts.marker(slot)
        metadata = {"model_name": model, **call_metadata(self.run, slot)}
        return AIMessage(content=self.texts.marker(slot), response_metadata=metadata)

    async def materialize(self, value: Any) -> Any:
        """``value`` with the real texts in it (waiting for those not generated yet), and
        usage metadata on the chat messages that Parrot generated."""
        slots = self.texts.slots_in(value)
        if not slots:
            return value
        texts = await self.run.values(slots, self.criteria, self.wait_timeout)
        filled = self.texts.fill(value, texts)
        calls = _calls_of_messages(filled)
        if not calls:
            return filled
        usage = await self.run.usage(calls)
        return _with_usage(filled, usage)


def _formats_as_marker(value: Any) -> bool:
    """A string (maybe holding markers) or a field of a structured value (its field
    marker) is formatted into a prompt as it is; anything else needs its real value."""
    return isinstance(value, str) or (isinstance(value, Structured) and value.is_field)


def _prompt_value(value: Any) -> PromptValue:
    """What a LangChain model makes of its input (a prompt value, a string, messages)."""
    if isinstance(value, PromptValue):
        return value
    if isinstance(value, str):
        return StringPromptValue(text=value)
    if isinstance(value, Sequence):
        return ChatPromptValue(messages=convert_to_messages(value))
    raise ValueError(
        f"Invalid input type {type(value)}. Must be a PromptValue, str, or list of BaseMessages."
    )


def _calls_of_messages(value: Any) -> list[str]:
    if isinstance(value, AIMessage):
        call = value.response_metadata.get(CALL_KEY)
        return [call] if call and value.usage_metadata is None else []
    if isinstance(value, Mapping):
        return [c for v in value.values() for c in _calls_of_messages(v)]
    if isinstance(value, list | tuple):
        return [c for v in value for c in _calls_of_messages(v)]
    return []


def _with_usage(value: Any, usage: Mapping[str, Any]) -> Any:
    if isinstance(value, AIMessage):
        found = usage.get(value.response_metadata.get(CALL_KEY))
        if found is None or value.usage_metadata is not None:
            return value
        metadata = value.response_metadata | {"finish_reason": found.finish_reason}
        return value.model_copy(
            update={"usage_metadata": call_usage_metadata(found), "response_metadata": metadata}
        )
    if isinstance(value, Mapping):
        return {k: _with_usage(v, usage) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_usage(v, usage) for v in value]
    if type(value) is tuple:
        return tuple(_with_usage(v, usage) for v in value)
    return value
