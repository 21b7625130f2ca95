"""The builtin engine: loads the model and drives :class:`EngineCore` from a worker thread.

The asyncio side never touches engine state: every request becomes a command that the
engine thread runs between model steps, and results come back through futures.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from parrot.engines.builtin import text_work
from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.attention.registry import default_backend
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import ContextPool, Target
from parrot.engines.builtin.cuda_graphs import PAD_BLOCKS, capture_decode_graphs, graph_batch_sizes
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.engine_core import EngineCore
from parrot.engines.builtin.fused_decode import fused_decode_step
from parrot.engines.builtin.grammars import GrammarCompiler
from parrot.engines.builtin.jobs import Final, GenerateResult, JobSink, Outbox
from parrot.engines.builtin.kv_cache import allocate_kv_cache, num_blocks_for_budget
from parrot.engines.builtin.metrics import EngineMetrics
from parrot.engines.builtin.model import cpu_paths
from parrot.engines.builtin.model.build import build_model
from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model_runner import ModelRunner
from parrot.engines.builtin.tokenizer import Tokenizer
from parrot.engines.protocol.errors import BadRequestError, EngineShutdownError
from parrot.engines.protocol.grammar import check_whole_answer
from parrot.engines.protocol.schemas import (
    AbortResponse,
    FillResponse,
    GenerateResponse,
    StreamEnd,
    TokenStreamEvent,
)
from parrot.wire.sampling import SamplingParams

log = logging.getLogger(__name__)
GATHER_S, GATHER_MAX_S = 0.003, 0.010  # an idle engine's wait for more work (see _loop)
T = TypeVar("T")
Reply = TypeVar("Reply", GenerateResponse, StreamEnd)


class BuiltinEngine:
    """One model served by one engine thread; the ``Engine`` protocol of the ServeCore
    (platform/serve/engines/client.py), so it is used in-process as ``HttpEngine`` is remotely.

    The engine thread builds the model and then runs the step loop: all torch work of the
    engine happens on it. (With the OpenMP build of torch, a thread that starts running
    parallel ops after another thread already did runs them about 2x slower here, so
    loading on one thread and stepping on another would halve decode speed.)
    """

    def __init__(self, config: EngineConfig, on_stage: Callable[[str], None] = lambda _: None) -> None:
        """``on_stage``: told each stage of the build (``parrot engine``'s /healthz names it)."""
        self.config = config
        self._stage = on_stage
        # (fn, args, sink, reply): run between steps; the error (or the result) goes to sink.
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._outbox = Outbox()  # the engine thread's answers, sent once its stats are published
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._stopping = False
        self._build_error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._loop, name="parrot-engine", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        if self._build_error is not None:
            self._thread.join()
            self._thread = None
            raise self._build_error
        self.metrics = EngineMetrics(self.model_name, self.stats_now)

    def _build(self) -> None:
        config = self.config
        self.device = config.torch_device()
        self.dtype = config.torch_dtype()
        if self.device.type == "cpu" and config.num_threads:
            torch.set_num_threads(config.num_threads)
        cache_dir = Path(config.cache_dir) if config.cache_dir else default_cache_dir()
        self.model_folder = resolve_model_folder(config.model, cache_dir, self._stage)
        self._stage("loading the tokenizer")
        self.model_config = mc = ModelConfig.from_folder(self.model_folder)
        self.tokenizer = Tokenizer(self.model_folder, config.tool_format)
        backend_name = config.attention_backend or default_backend(self.device.type)
        self.backend = create_backend(backend_name, mc.num_heads, mc.num_kv_heads, mc.head_dim)
        self._stage("loading the weights and timing the CPU's kernels")
        self.model = build_model(config, mc, self.model_folder, self.backend)
        self.kv_dtype = kv_dtype = config.torch_kv_dtype()
        num_blocks = num_blocks_for_budget(mc, config.block_size, kv_dtype, config.kv_cache_bytes)
        sizes = graph_batch_sizes(config.cuda_graph_batch_sizes, self.device, self.model)
        pad = PAD_BLOCKS if sizes else 0  # the graphs' scratch block, outside the manager's
        kv_cache = allocate_kv_cache(mc, num_blocks + pad, config.block_size, kv_dtype, self.device)
        pool = ContextPool(BlockManager(num_blocks, config.block_size), kv_cache)
        max_len = min(config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings)
        graph_len = min(max_len, config.cuda_graph_max_len)
        self._stage("capturing CUDA graphs" if sizes else "preparing the decode step (compiled once)")
        graphs = capture_decode_graphs(self.model, pool, graph_len, sizes, config.shared_prefix)
        whole_step = graphs or fused_decode_step(self.model, pool, config, self.device)
        runner = ModelRunner(self.model, pool, config.shared_prefix, self.device, whole_step)
        eos = frozenset(mc.eos_token_ids) | self.tokenizer.eos_token_ids
        self.core = EngineCore(
            runner,
            config.scheduler,
            self.tokenizer,
            vocab_size=mc.vocab_size,
            max_model_len=max_len,
            eos_token_ids=eos,
            outbox=self._outbox,
            jump_forward=config.jump_forward,
        )
        self.grammars = GrammarCompiler(self.tokenizer.hf, mc.vocab_size, eos, config.grammar)
        self.model_name = mc.name
        self._publish()

    # -- lifecycle -----------------------------------------------------------------------
    def check_running(self) -> None:
        """The engine runs from construction on (its thread starts then); raise when it was
        stopped since."""
        if self._thread is None or not self._thread.is_alive():
            raise EngineShutdownError("the engine has been stopped")

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
            self.grammars.close()

    def _loop(self) -> None:
        """The engine thread: it builds the model, then runs commands (new jobs, frees,
        aborts) between steps, and a step; what either answers leaves through the outbox
        once the statistics are published."""
        try:
            self._build()
        except BaseException as error:
            self._build_error = error
            return
        finally:
            self._ready.set()
        busy, gather_first = False, None
        while True:
            ran = False
            while True:
                try:
                    fn, args, sink, reply = self._commands.get_nowait()
                except queue.Empty:
                    break
                ran = True
                try:
                    result = fn(*args)
                except BaseException as error:
                    if sink is not None:
                        self._outbox.post([(sink, Final(error=error))])
                else:
                    if reply:
                        self._outbox.post([(sink, Final(result))])
            # Work came to an idle engine: what comes while requests keep coming (each within
            # GATHER_S of the last, up to GATHER_MAX_S) joins it: requests sent together (a
            # DAG's ready calls, consumers of calls ended in one step) start in one prefill.
            if ran and not busy and self.core.has_work():
                now = time.monotonic()
                gather_first = gather_first or now
                if self._wake.wait(timeout=max(0.0, min(now + GATHER_S, gather_first + GATHER_MAX_S) - now)):
                    self._wake.clear()
                    continue
            gather_first = None
            if self._stopping:
                self.core.fail_all(EngineShutdownError("the engine is shutting down"))
                self._outbox.deliver()
                return
            try:
                busy = self.core.step()
            except Exception:  # a bug: fail what is in flight, keep serving
                log.exception("engine step failed")
                self.core.fail_all(EngineShutdownError("internal engine error during a step"))
                busy = False
            # An idle step answers too: a fork whose parent never came fails on its own.
            if busy or ran or self._outbox.holds:
                self._publish()
                self._outbox.deliver()
            if not busy:
                self._wake.wait(timeout=1.0)
                self._wake.clear()

    def _publish(self) -> None:
        """Statistics as of now, for readers on other threads: a ping is answered at once,
        whatever step runs (a long prefill must not look like a dead engine)."""
        self._snapshot = (time.monotonic(), self.core.snapshot())

    def _submit(self, fn: Callable[..., Any], args: tuple, sink: JobSink | None, reply: bool) -> None:
        """``fn(*args)`` on the engine thread between steps; its error (result if ``reply``) to ``sink``."""
        if self._stopping or self._thread is None:
            raise EngineShutdownError("the engine is not running")
        self._commands.put((fn, args, sink, reply))
        self._wake.set()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the engine thread and return its result (or raise its error)."""
        sink = JobSink(asyncio.get_running_loop())
        self._submit(fn, args, sink, reply=True)
        return await sink.result

    # -- the engine API (the ``Engine`` protocol of platform/serve/engines/client.py) ------
    async def fill(
        self,
        context_id: int,
        token_ids: Sequence[int] | None = None,
        text: str | None = None,
        parent_context_id: int | None = None,
        *,
        parent_len: int | None = None,
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
        parent_timeout_ms: int = 0,
        background: bool = False,
    ) -> FillResponse:
        """Fill tokens (or text) into a context; a ``background`` fill prepares for later
        and only takes what steps used by other jobs can spare."""
        if (token_ids is None) == (text is None):
            raise BadRequestError("fill needs exactly one of token_ids or text")
        tokens = await self._tokens(token_ids, text)
        sink = JobSink(asyncio.get_running_loop())
        target = Target(context_id, parent_context_id, parent_len, parent_timeout_ms / 1000)
        args = (target, tokens, sink, priority, list(checkpoints), background)
        return await self._job(self.core.submit_fill, args, sink)

    async def generate(
        self,
        context_id: int,
        sampling: SamplingParams,
        parent_context_id: int | None = None,
        *,
        parent_len: int | None = None,
        token_ids: Sequence[int] | None = None,
        text: str | None = None,
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
        parent_timeout_ms: int = 0,
    ) -> GenerateResponse:
        """Generate into a context, after filling ``token_ids`` (or ``text``), the prompt's
        tail, in the same job."""
        sink = JobSink(asyncio.get_running_loop())
        args = await self._generate_args(
            context_id, sampling, parent_context_id, parent_len, token_ids, text, priority, checkpoints,
            parent_timeout_ms, sink,
        )  # fmt: skip
        result = await self._job(self.core.submit_generate, args, sink)
        self.metrics.observe(result)
        await check_whole_answer(sampling.format, result.text, result.finish_reason)  # what decoding skipped
        return _reply(result, GenerateResponse)

    async def generate_stream(
        self,
        context_id: int,
        sampling: SamplingParams,
        parent_context_id: int | None = None,
        *,
        parent_len: int | None = None,
        token_ids: Sequence[int] | None = None,
        text: str | None = None,
        priority: int = 0,
        checkpoints: Sequence[tuple[int, int]] = (),
        parent_timeout_ms: int = 0,
        stream_interval_ms: int = 0,
    ) -> AsyncIterator[TokenStreamEvent | StreamEnd]:
        """Yields a :class:`TokenStreamEvent` per token (with ``stream_interval_ms``, after
        the first token at most one per interval, joining the tokens between), then the
        :class:`StreamEnd`."""
        sink = JobSink(asyncio.get_running_loop(), stream=True, interval_s=stream_interval_ms / 1000)
        args = await self._generate_args(
            context_id, sampling, parent_context_id, parent_len, token_ids, text, priority, checkpoints,
            parent_timeout_ms, sink,
        )  # fmt: skip
        self._submit(self.core.submit_generate, args, sink, reply=False)
        finished = False
        try:
            while (event := await sink.events.get()) is not None:
                yield event
            result = await sink.result
            self.metrics.observe(result)
            await check_whole_answer(sampling.format, result.text, result.finish_reason)
            yield _reply(result, StreamEnd)
            finished = True
        finally:
            if not finished:  # the client went away: stop generating for it
                self._abandon(sink)

    async def _generate_args(
        self, context_id, sampling, parent_context_id, parent_len, token_ids, text, priority, checkpoints,
        parent_timeout_ms, sink: JobSink,
    ) -> tuple:  # fmt: skip
        """The arguments of ``EngineCore.submit_generate`` (its prompt tail tokenized and its
        output format compiled first)."""
        if token_ids is not None and text is not None:
            raise BadRequestError("give the prompt tail as token_ids or as text, not both")
        # The output format compiles on the grammar worker (a bad one is a 400 here).
        grammar = await self.grammars.compile(sampling.format) if sampling.format is not None else None
        tail = await self._tokens(token_ids, text) if (token_ids or text) else []
        target = Target(context_id, parent_context_id, parent_len, parent_timeout_ms / 1000)
        return (target, sampling, sink, tail, priority, list(checkpoints), grammar)

    async def _tokens(self, token_ids: Sequence[int] | None, text: str | None) -> list[int]:
        return (
            list(token_ids) if token_ids is not None else await text_work.tokenize(self.tokenizer, text or "")
        )

    async def _job(self, submit: Callable[..., None], args: tuple, sink: JobSink) -> Any:
        """Submit a job and wait for its result; a caller that goes away (cancelled while
        the job waits or runs) stops it."""
        self._submit(submit, args, sink, reply=False)
        try:
            return await asyncio.shield(sink.result)
        except asyncio.CancelledError:
            self._abandon(sink)
            raise

    def _abandon(self, sink: JobSink) -> None:
        """The caller went away: cancel its job (commands run in order: after its submission).
        Its result, or a failed submission, is nobody's business any more."""
        sink.result.add_done_callback(lambda f: f.cancelled() or f.exception())
        if not sink.result.done() and not self._stopping:
            self._submit(self.core.cancel, (sink,), None, reply=False)

    async def abort(self, context_ids: Sequence[int]) -> AbortResponse:
        """Stop the jobs on these contexts and free them."""
        jobs, freed = await self._call(self.core.abort, list(context_ids))
        return AbortResponse(aborted_jobs=jobs, freed_contexts=freed)

    async def abort_range(self, start: int, end: int) -> AbortResponse:
        """:meth:`abort` for the contexts with ids in ``[start, end)``."""
        jobs, freed = await self._call(self.core.abort_range, start, end)
        return AbortResponse(aborted_jobs=jobs, freed_contexts=freed)

    async def free_context(self, context_id: int) -> int:
        return await self._call(self.core.free_context, context_id)

    async def ping(self, timeout_s: float | None = None) -> dict:
        """The statistics published last (see :meth:`stats_now`): answered at once, so
        ``timeout_s`` never runs out."""
        return self.stats_now()

    async def aclose(self) -> None:
        """Stop the engine thread (waiting for it off the event loop)."""
        await asyncio.to_thread(self.stop)

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    async def stats(self) -> dict:
        """Engine statistics, read on the engine thread between steps (so they are exact)."""
        return {**self._served(), **await self._call(self.core.snapshot)}

    async def check_integrity(self, idle_wait_s: float = 30.0) -> None:
        """Raise :class:`IntegrityError` if the engine's bookkeeping contradicts itself (see
        :meth:`EngineCore.check_integrity`). It waits up to ``idle_wait_s`` for the engine to
        have no job, then checks on the engine thread, between two steps (never racing one)."""
        deadline = time.monotonic() + idle_wait_s
        while await self._call(self.core.has_work) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self._call(self.core.check_integrity)

    def stats_now(self) -> dict:
        """The statistics the engine thread published last (after its latest step or
        command), without waiting for it; ``heartbeat_age_s`` says how old they are."""
        if self._thread is None or not self._thread.is_alive():
            raise EngineShutdownError("the engine is not running")
        at, snapshot = self._snapshot
        return {**self._served(), **snapshot, "heartbeat_age_s": round(time.monotonic() - at, 3)}

    def _served(self) -> dict:
        """The model it serves, the weight format and dtype it runs in, its KV cache's dtype,
        and on the CPU what the CPU offers and which product large steps run on."""
        dtype, kv_dtype = (str(t).removeprefix("torch.") for t in (self.dtype, self.kv_dtype))
        served = {"model": self.model_name, "weights": self.config.weights, "dtype": dtype}
        paths = cpu_paths.report(self.model.dense_choice, self.model.int_dot_choice)
        cpu = {"cpu": paths} if self.device.type == "cpu" else {}
        return {**served, "kv_dtype": kv_dtype, **cpu}


def _reply(result: GenerateResult, kind: type[Reply]) -> Reply:
    """A finished generation as the wire says it: a ``GenerateResponse``, or the
    ``StreamEnd`` of a stream (the same fields, without the engine-clock timings)."""
    fields = ("context_id", "token_ids", "text", "finish_reason", "prompt_tokens", "cached_tokens")
    return kind(**{name: getattr(result, name) for name in fields}, stop_string=result.stop_string)
