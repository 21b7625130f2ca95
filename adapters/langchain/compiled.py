"""``compile_chain``: a whole LCEL chain as semantic calls in one Parrot session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.base import coerce_to_runnable
from langchain_core.runnables.config import run_in_executor
from pydantic import BaseModel

from parrot.adapters.langchain.chain_run import ChainRun
from parrot.adapters.langchain.plan import CompileError, Plan, plan_chain
from parrot.adapters.langchain.session_run import open_run
from parrot.adapters.langchain.settings import ParrotSettings
from parrot.adapters.langchain.sync import iterate_sync, run_sync


def compile_chain(chain: Runnable | Mapping[str, Any]) -> CompiledChain:
    """The chain (or a dict of chains, LangChain's shorthand for a ``RunnableParallel``)
    as a :class:`CompiledChain`; raises :class:`CompileError` for a shape it cannot map
    (see :mod:`parrot.adapters.langchain.plan`: what maps, what runs on the client and
    what is refused)."""
    chain = coerce_to_runnable(chain)
    plan = plan_chain(chain)
    if not plan.models:
        raise CompileError("the chain has no ParrotLLM or ParrotChatModel: there is nothing to run on Parrot")
    servers = {m.client_config().base_url for m in plan.models}
    if len(servers) > 1:
        raise CompileError(
            f"the chain's Parrot models use different servers {sorted(servers)}; a compiled chain "
            "runs in one session, on one server: give every model the same base_url"
        )
    return CompiledChain(chain, plan)


class CompiledChain(Runnable[Any, Any]):
    """A chain compiled onto Parrot: ``invoke`` / ``ainvoke`` / ``batch`` / ``abatch``
    return what the chain returns, but every LangChain variable is a semantic variable,
    each model step a semantic call that reads the variables of the steps before it, and
    the whole DAG is submitted before anything is waited for; only the chain's final
    outputs are fetched (and the inputs of steps that run on the client, when it has any).
    A batch runs all its inputs in one session at once (``max_concurrency`` is not used).
    ``stream`` / ``astream`` submit the same DAG and stream the chain's final output from
    its semantic variable as it is generated (see :meth:`ChainRun.stream_output`: a
    string's text deltas, a chat message's chunks, any other output whole).

    The server, timeouts and default criteria are those of the chain's first Parrot model;
    RunnableConfig metadata ``{"parrot_criteria": "latency" | "throughput"}`` picks the
    criteria of a run. Inside an SDK ``with client.session()`` block on the same server,
    the calls go into that session.
    """

    def __init__(self, chain: Runnable, plan: Plan) -> None:
        self.chain = chain
        self._plan = plan
        self._settings: ParrotSettings = plan.models[0]

    def get_name(self, suffix: str | None = None, *, name: str | None = None) -> str:
        return name or f"Compiled{self.chain.get_name(suffix)}"

    @property
    def InputType(self) -> Any:
        return self.chain.InputType

    @property
    def OutputType(self) -> Any:
        return self.chain.OutputType

    def get_input_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        return self.chain.get_input_schema(config)

    def get_output_schema(self, config: RunnableConfig | None = None) -> type[BaseModel]:
        return self.chain.get_output_schema(config)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self._call_with_config(self._invoke, input, config)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return await self._acall_with_config(self._ainvoke, input, config)

    def batch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        return self._batch_with_config(self._batch, inputs, config, return_exceptions=return_exceptions)

    async def abatch(
        self,
        inputs: list[Any],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[Any]:
        return await self._abatch_with_config(
            self._abatch, inputs, config, return_exceptions=return_exceptions
        )

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        yield from self._transform_stream_with_config(iter([input]), self._transform, config)

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        async def one() -> AsyncIterator[Any]:
            yield input

        async for chunk in self._atransform_stream_with_config(one(), self._atransform, config):
            yield chunk

    def _transform(self, inputs: Iterator[Any], config: RunnableConfig) -> Iterator[Any]:
        input = next(inputs)
        yield from iterate_sync(lambda: self._stream(input, config, _run_sync_step))

    async def _atransform(self, inputs: AsyncIterator[Any], config: RunnableConfig) -> AsyncIterator[Any]:
        async for chunk in self._stream(await anext(inputs), config, _run_async_step):
            yield chunk

    async def _stream(self, input: Any, config: RunnableConfig, on_client: Any) -> AsyncIterator[Any]:
        """The chain's output for ``input``, streamed, in a session of its own (or the
        enclosing one) that is closed when the stream ends or is closed."""
        settings = self._settings
        async with open_run(settings, share_inputs=True) as run:
            criteria = settings.criteria_for(config.get("metadata"))
            chain = ChainRun(run, config, criteria, settings.wait_timeout, on_client)
            async for chunk in chain.stream_output(self._plan.root, input):
                yield chunk

    def _invoke(self, input: Any, config: RunnableConfig) -> Any:
        return _raise_or_return(self._batch([input], [config])[0])

    async def _ainvoke(self, input: Any, config: RunnableConfig) -> Any:
        return _raise_or_return((await self._abatch([input], [config]))[0])

    def _batch(self, inputs: list[Any], config: list[RunnableConfig]) -> list[Any]:
        return run_sync(lambda: self._run(inputs, config, _run_sync_step))

    async def _abatch(self, inputs: list[Any], config: list[RunnableConfig]) -> list[Any]:
        return await self._run(inputs, config, _run_async_step)

    async def _run(self, inputs: list[Any], configs: list[RunnableConfig], on_client: Any) -> list[Any]:
        """Every input's chain in one session, concurrently; an input that fails gives its
        exception in its place."""
        settings = self._settings
        async with open_run(settings, share_inputs=True) as run:
            runs = [
                ChainRun(run, c, settings.criteria_for(c.get("metadata")), settings.wait_timeout, on_client)
                for c in configs
            ]
            return await asyncio.gather(
                *(r.output(self._plan.root, i) for r, i in zip(runs, inputs, strict=True)),
                return_exceptions=True,
            )

    def __repr__(self) -> str:
        return f"CompiledChain({self.chain!r})"


async def _run_async_step(runnable: Runnable, value: Any, config: RunnableConfig) -> Any:
    return await runnable.ainvoke(value, config)


async def _run_sync_step(runnable: Runnable, value: Any, config: RunnableConfig) -> Any:
    """Under a synchronous invoke a step runs synchronously, in a worker thread."""
    return await run_in_executor(config, runnable.invoke, value, config)


def _raise_or_return(result: Any) -> Any:
    if isinstance(result, BaseException):
        raise result
    return result
