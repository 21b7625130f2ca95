"""``ParrotChatModel``: a LangChain chat model served by Parrot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool

from parrot.adapters.langchain.model_calls import (
    call_metadata,
    call_usage_metadata,
    role_of,
    submit_chat,
    text_of,
    token_usage,
)
from parrot.adapters.langchain.session_run import SessionRun, open_run, shared_session
from parrot.adapters.langchain.settings import ParrotSettings
from parrot.adapters.langchain.streaming import chat_generation_chunk, whole_message_chunk
from parrot.adapters.langchain.structured import (
    METHODS,
    Method,
    output_format,
    parser,
    response_format,
    structured_schema,
    with_raw,
)
from parrot.adapters.langchain.sync import run_sync
from parrot.adapters.langchain.tool_calling import (
    TOOL_ARGS,
    chat_result,
    has_tool_turns,
    openai_messages,
    openai_tool_choice,
    openai_tools,
)
from parrot.sdk.aclient import AsyncClient
from parrot.sdk.client import Client


class ParrotChatModel(ParrotSettings, BaseChatModel):
    """A chat model on a Parrot server::

        chat = ParrotChatModel(base_url="http://127.0.0.1:9000", max_tokens=64, temperature=0)
        chat.invoke([("system", "Answer briefly."), ("human", "Why is the sea salty?")])

    The messages are rendered on the server with the model's own chat template, into a
    semantic call: system messages are constant text (a system message shared by many
    calls is one shared prefix on the engines), the other messages are bound by value.
    ``batch`` / ``abatch`` submit all chats to one session at once; ``stream`` /
    ``astream`` stream token by token from the server's ``/v1/chat/completions``. Inside
    an SDK ``with client.session()`` block on the same server, the calls go into that
    session.

    ``with_structured_output(schema)`` constrains the reply to the schema's JSON (the
    call's output is a typed variable) and parses it; ``bind_tools(tools)`` lets the
    model call tools (``AIMessage.tool_calls``), and a chat with tool turns in it
    (``ToolMessage``, tool calls) runs on the server's OpenAI-compatible chat route.
    """

    @property
    def _llm_type(self) -> str:
        return "parrot-chat"

    @property
    def _identifying_params(self) -> Mapping[str, Any]:
        return self.identifying_params()

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        metadata = run_manager.metadata if run_manager else None
        return run_sync(lambda: self._reply(messages, stop, metadata, kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await self._reply(messages, stop, run_manager.metadata if run_manager else None, kwargs)

    def bind_tools(
        self,
        tools: Sequence[Mapping[str, Any] | type | Callable | BaseTool],
        *,
        tool_choice: str | bool | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with ``tools`` (converted by ``convert_to_openai_tool``) offered on
        every run. ``tool_choice``: ``auto`` (default), ``none``, ``required`` (or ``any``
        / True), or a tool's name; ``parallel_tool_calls``: whether one answer may call
        several tools; ``strict``: the tools' arguments must match their schemas exactly."""
        formatted = openai_tools(tools, strict)
        options = {"tool_choice": openai_tool_choice(tool_choice, formatted)}
        options["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(tools=formatted, **{k: v for k, v in options.items() if v is not None}, **kwargs)

    def with_structured_output(
        self,
        schema: Mapping[str, Any] | type | None = None,
        *,
        method: Method = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, Any]:
        """The model answering with a value of ``schema`` (a pydantic class: an instance of
        it; a TypedDict, a JSON schema or an OpenAI tool dict: a dict).

        ``method``: ``json_schema`` (default: the reply is constrained to the schema's JSON
        through ``response_format``), ``json_mode`` (any JSON object; ``schema`` only
        parses it) or ``function_calling`` (a forced call of a tool with the schema's
        parameters). ``strict``: every object of the schema is closed (OpenAI's strict mode:
        no keys but the schema's). ``include_raw``: return ``{"raw", "parsed",
        "parsing_error"}``."""
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, not {method!r}")
        if schema is None and method != "json_mode":
            raise ValueError(f"with_structured_output(method={method!r}) needs a schema")
        found = None if schema is None else structured_schema(schema, strict)
        traced = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        if method == "function_calling":
            tool = schema if found.model is not None else _tool_of(found.name, found.schema)
            model = self.bind_tools(
                [tool], tool_choice=found.name, strict=strict, ls_structured_output_format=traced
            )
        else:
            model = self.bind(
                response_format=response_format(method, found, strict), ls_structured_output_format=traced
            )
        read = parser(method, found)
        return with_raw(model, read) if include_raw else model | read

    async def _reply(
        self, messages: list[BaseMessage], stop: list[str] | None, metadata: Mapping | None, kwargs: dict
    ) -> ChatResult:
        kwargs = dict(kwargs)
        tools = {name: kwargs.pop(name) for name in TOOL_ARGS if name in kwargs}
        answer_format = kwargs.pop("response_format", None)
        sampling = self.sampling(stop, kwargs)
        if tools or has_tool_turns(messages):
            return await self._chat_reply(messages, sampling, tools, answer_format)
        typed = output_format(answer_format)
        if typed is not None:
            sampling["format"] = typed
        criteria = self.criteria_for(metadata)
        async with open_run(self, share_inputs=False) as run:
            marked = [_marked(run, m) for m in messages]
            slot, model = await submit_chat(run, marked, "reply", sampling, self.model)
            await run.values([slot], criteria, self.wait_timeout)
            usage = (await run.usage([slot.call_id]))[slot.call_id]
            info = {"finish_reason": usage.finish_reason, "model_name": model, **call_metadata(run, slot)}
        message = AIMessage(content=slot.value or "", usage_metadata=call_usage_metadata(usage))
        return ChatResult(
            generations=[ChatGeneration(message=message, generation_info=info)],
            llm_output={"token_usage": token_usage([usage]), "model_name": model},
        )

    async def _chat_reply(
        self,
        messages: list[BaseMessage],
        sampling: dict[str, Any],
        tools: dict[str, Any],
        answer_format: Mapping[str, Any] | None,
    ) -> ChatResult:
        """One answer from ``/v1/chat/completions``: text or tool calls."""
        offered = openai_tools(tools.get("tools") or (), None)
        options = {
            "tools": offered or None,
            "tool_choice": openai_tool_choice(tools.get("tool_choice"), offered),
            "parallel_tool_calls": tools.get("parallel_tool_calls"),
            "response_format": answer_format,
        }
        config = self.client_config()
        timeout = config.timeout + self.wait_timeout  # the route answers once it has generated
        turns = openai_messages(messages)
        async with AsyncClient(config.base_url, timeout=timeout) as client:
            reply = await client.chat(
                turns,
                model=self.model,
                api_key=self.api_key_value(),
                metadata=self.request_metadata(),
                **options,
                **sampling,
            )
        return chat_result(reply)

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Every chat submitted at once into one session (see :meth:`abatch`)."""
        if not inputs:
            return []
        return run_sync(lambda: self.abatch(inputs, config, return_exceptions=return_exceptions, **kwargs))

    async def abatch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[BaseMessage]:
        """Every chat submitted at once (up to ``max_concurrency``) into one session, so
        the server batches them and shares their prefixes."""
        async with shared_session(self):
            return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        if _needs_whole_answer(messages, kwargs):
            yield whole_message_chunk(self._generate(messages, stop, run_manager, **kwargs))
            return
        sampling = self.sampling(stop, kwargs)
        config = self.client_config()
        with Client(config.base_url, timeout=config.timeout) as client:
            stream = client.stream_chat(
                _turns(messages),
                model=self.model,
                api_key=self.api_key_value(),
                metadata=self.request_metadata(),
                **sampling,
            )
            for delta in stream:
                yield chat_generation_chunk(delta)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        if _needs_whole_answer(messages, kwargs):
            yield whole_message_chunk(await self._agenerate(messages, stop, run_manager, **kwargs))
            return
        sampling = self.sampling(stop, kwargs)
        config = self.client_config()
        async with AsyncClient(config.base_url, timeout=config.timeout) as client:
            stream = client.stream_chat(
                _turns(messages),
                model=self.model,
                api_key=self.api_key_value(),
                metadata=self.request_metadata(),
                **sampling,
            )
            async for delta in stream:
                yield chat_generation_chunk(delta)


def _marked(run: SessionRun, message: BaseMessage) -> BaseMessage:
    """System messages stay constant text; the others' texts become inputs of the call."""
    if isinstance(message, SystemMessage):
        return message
    marker = run.texts.known(role_of(message), text_of(message))
    return message.model_copy(update={"content": marker})


def _turns(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    return [{"role": role_of(m), "content": text_of(m)} for m in messages]


def _needs_whole_answer(messages: Sequence[BaseMessage], kwargs: Mapping[str, Any]) -> bool:
    """A run with tools, tool turns or a response format answers in one piece (its tool
    calls and JSON are whole, checked values), so its stream is that one chunk."""
    return any(k in kwargs for k in (*TOOL_ARGS, "response_format")) or has_tool_turns(messages)


def _tool_of(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": dict(schema)}}
