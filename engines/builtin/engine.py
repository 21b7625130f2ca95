"""The builtin engine: loads the model and drives :class:`EngineCore` from a worker thread.

The asyncio side never touches engine state: every request becomes a command that the
engine thread runs between model steps, and results come back through futures.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.attention.registry import default_backend
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.config import EngineConfig
from parrot.engines.builtin.context import ContextPool
from parrot.engines.builtin.core import EngineCore
from parrot.engines.builtin.jobs import FillResult, GenerateResult, JobSink, TokenEvent
from parrot.engines.builtin.kv_cache import allocate_kv_cache, num_blocks_for_budget
from parrot.engines.builtin.model.build import build_model
from parrot.engines.builtin.model.config import ModelConfig
from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder
from parrot.engines.builtin.runner import ModelRunner
from parrot.engines.builtin.scheduler import LocalScheduler
from parrot.engines.builtin.tokenizer import Tokenizer
from parrot.engines.protocol.errors import EngineShutdownError
from parrot.engines.protocol.sampling import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")


class BuiltinEngine:
    """One model served by one engine thread.

    The engine thread builds the model and then runs the step loop: all torch work of the
    engine happens on it. (With the OpenMP build of torch, a thread that starts running
    parallel ops after another thread already did runs them about 2x slower here, so
    loading on one thread and stepping on another would halve decode speed.)
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._stopping = False
        self._build_error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._main, name="parrot-engine", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._build_error is not None:
            self._thread.join()
            self._thread = None
            raise self._build_error

    def _main(self) -> None:
        try:
            self._build()
        except BaseException as error:
            self._build_error = error
            self._ready.set()
            return
        self._ready.set()
        self._loop()

    def _build(self) -> None:
        config = self.config
        self.device = config.torch_device()
        self.dtype = config.torch_dtype()
        if self.device.type == "cpu" and config.num_threads:
            torch.set_num_threads(config.num_threads)
        cache_dir = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
        self.model_folder = resolve_model_folder(config.model, cache_dir)
        self.model_config = ModelConfig.from_folder(self.model_folder)
        self.tokenizer = Tokenizer(self.model_folder)
        mc = self.model_config
        backend_name = config.attention_backend or default_backend(self.device.type)
        self.backend = create_backend(backend_name, mc.num_heads, mc.num_kv_heads, mc.head_dim)
        self.model = build_model(config, mc, self.model_folder, self.backend)
        num_blocks = num_blocks_for_budget(mc, config.block_size, self.dtype, config.kv_cache_bytes)
        kv_cache = allocate_kv_cache(mc, num_blocks, config.block_size, self.dtype, self.device)
        pool = ContextPool(BlockManager(num_blocks, config.block_size), kv_cache)
        runner = ModelRunner(self.model, pool, config.shared_prefix, self.device)
        max_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        eos = frozenset(mc.eos_token_ids) | self.tokenizer.eos_token_ids
        self.core = EngineCore(
            runner,
            partial(LocalScheduler, config.scheduler),
            self.tokenizer,
            vocab_size=mc.vocab_size,
            max_model_len=max_len,
            eos_token_ids=eos,
        )
        self.model_name = mc.name

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """The engine runs from construction on; this only checks that it still does."""
        if self._thread is None or not self._thread.is_alive():
            raise EngineShutdownError("the engine has been stopped")

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while True:
            self._run_commands()
            if self._stopping:
                self._run_commands()
                self.core.fail_all(EngineShutdownError("the engine is shutting down"))
                return
            try:
                busy = self.core.step()
            except Exception:  # a bug: fail what is in flight, keep serving
                log.exception("engine step failed")
                self.core.fail_all(EngineShutdownError("internal engine error during a step"))
                busy = False
            if not busy:
                self._wake.wait(timeout=1.0)
                self._wake.clear()

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            command()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine thread and return its result (or raise its error)."""
        if self._stopping or self._thread is None:
            raise EngineShutdownError("the engine is not running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def command() -> None:
            try:
                result = fn(*args)
            except BaseException as error:
                loop.call_soon_threadsafe(_settle, future, None, error)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        self._commands.put(command)
        self._wake.set()
        return await future

    # -- the engine API ------------------------------------------------------------------
    async def fill(
        self, context_id: int, token_ids: Sequence[int], parent_context_id: int | None = None
    ) -> FillResult:
        sink = JobSink(asyncio.get_running_loop())
        await self._call(self.core.submit_fill, context_id, parent_context_id, list(token_ids), sink)
        return await sink.result

    async def generate(
        self, context_id: int, sampling: SamplingParams, parent_context_id: int | None = None
    ) -> GenerateResult:
        sink = JobSink(asyncio.get_running_loop())
        await self._call(self.core.submit_generate, context_id, parent_context_id, sampling, sink)
        return await sink.result

    async def generate_stream(
        self, context_id: int, sampling: SamplingParams, parent_context_id: int | None = None
    ) -> AsyncIterator[TokenEvent | GenerateResult]:
        """Yields a :class:`TokenEvent` per token, then the :class:`GenerateResult`."""
        sink = JobSink(asyncio.get_running_loop(), stream=True)
        await self._call(self.core.submit_generate, context_id, parent_context_id, sampling, sink)
        try:
            while (event := await sink.events.get()) is not None:
                yield event
            yield await sink.result
        finally:
            if not sink.result.done():  # the client went away: stop generating for it
                await self._call(self.core.cancel, sink)

    async def free_context(self, context_id: int) -> int:
        return await self._call(self.core.free_context, context_id)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    async def stats(self) -> dict:
        """Engine statistics, read on the engine thread between steps (so they are exact)."""
        return {"model": self.model_name, **await self._call(self.core.snapshot)}


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
