"""``ParrotChatModel``: a LangChain chat model served by Parrot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig

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
from parrot.adapters.langchain.streaming import chat_generation_chunk
from parrot.adapters.langchain.sync import run_sync
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

    async def _reply(
        self, messages: list[BaseMessage], stop: list[str] | None, metadata: Mapping | None, kwargs: dict
    ) -> ChatResult:
        sampling = self.sampling(stop, kwargs)
        criteria = self.criteria_for(metadata)
        async with open_run(self.client_config(), share_inputs=False) as run:
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
        async with shared_session(self.client_config()):
            return await super().abatch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        sampling = self.sampling(stop, kwargs)
        config = self.client_config()
        with Client(config.base_url, timeout=config.timeout) as client:
            stream = client.stream_chat(
                _turns(messages), model=self.model, api_key=self.api_key_value(), **sampling
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
        sampling = self.sampling(stop, kwargs)
        config = self.client_config()
        async with AsyncClient(config.base_url, timeout=config.timeout) as client:
            stream = client.stream_chat(
                _turns(messages), model=self.model, api_key=self.api_key_value(), **sampling
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
