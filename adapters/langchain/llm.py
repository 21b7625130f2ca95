"""``ParrotLLM``: a LangChain text-completion model served by Parrot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from parrot.adapters.langchain.model_calls import call_metadata, token_usage
from parrot.adapters.langchain.session_run import open_run
from parrot.adapters.langchain.settings import ParrotSettings
from parrot.adapters.langchain.streaming import generation_chunk
from parrot.adapters.langchain.sync import run_sync
from parrot.adapters.langchain.texts import TextSlot
from parrot.sdk.aclient import AsyncClient
from parrot.sdk.client import Client


class ParrotLLM(ParrotSettings, BaseLLM):
    """A completion model on a Parrot server::

        llm = ParrotLLM(base_url="http://127.0.0.1:9000", max_tokens=64, temperature=0)
        llm.invoke("The sea is")

    Each prompt is a semantic call (``{{prompt}}{{completion}}``, the prompt bound by
    value, so braces in it are just text). ``batch`` / ``abatch`` submit all prompts to
    one session at once, then wait for them together, so the server batches them and
    shares their common prefixes. ``stream`` / ``astream`` stream token by token from the
    server's ``/v1/completions``. Inside an SDK ``with client.session()`` block on the
    same server, the calls go into that session.
    """

    @property
    def _llm_type(self) -> str:
        return "parrot"

    @property
    def _identifying_params(self) -> Mapping[str, Any]:
        return self.identifying_params()

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        metadata = run_manager.metadata if run_manager else None
        return run_sync(lambda: self._complete(prompts, stop, metadata, kwargs))

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        return await self._complete(prompts, stop, run_manager.metadata if run_manager else None, kwargs)

    async def _complete(
        self, prompts: list[str], stop: list[str] | None, metadata: Mapping | None, kwargs: dict
    ) -> LLMResult:
        sampling = self.sampling(stop, kwargs)
        criteria = self.criteria_for(metadata)
        async with open_run(self, share_inputs=False) as run:
            slots = await asyncio.gather(
                *(
                    run.generate([TextSlot("prompt", value=p)], "completion", sampling, self.models())
                    for p in prompts
                )
            )
            await run.values(slots, criteria, self.wait_timeout)
            usage = await run.usage([s.call_id for s in slots])
            generations = [
                [
                    Generation(
                        text=slot.value or "",
                        generation_info={
                            "finish_reason": usage[slot.call_id].finish_reason,
                            **call_metadata(run, slot),
                        },
                    )
                ]
                for slot in slots
            ]
        return LLMResult(
            generations=generations,
            llm_output={"token_usage": token_usage(usage.values()), "model_name": self.model},
        )

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        sampling = self.sampling(stop, kwargs)
        config = self.client_config()
        with Client(config.base_url, timeout=config.timeout) as client:
            stream = client.stream_completion(
                prompt,
                model=self.model,
                api_key=self.api_key_value(),
                metadata=self.request_metadata(),
                **sampling,
            )
            for delta in stream:
                chunk = generation_chunk(delta)
                if run_manager is not None:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        sampling = self.sampling(stop, kwargs)
        config = self.client_config()
        async with AsyncClient(config.base_url, timeout=config.timeout) as client:
            stream = client.stream_completion(
                prompt,
                model=self.model,
                api_key=self.api_key_value(),
                metadata=self.request_metadata(),
                **sampling,
            )
            async for delta in stream:
                chunk = generation_chunk(delta)
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk
