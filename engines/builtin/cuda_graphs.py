"""Decode steps replayed as CUDA graphs, one graph per batch size.

A decode step of a small model on a GPU is bound by kernel launches, not by the GPU: a few
hundred small kernels, each launched from Python. A CUDA graph records the launches of one
step once and replays them with one call. A graph fixes its shapes and the addresses it
reads, so the graphs read static input buffers sized for the largest one (token ids,
positions, KV slots, key counts, and a block table as wide as the longest context a graph
serves), each graph the first rows of them; a step of ``n``
sequences is padded to the next captured size, its inputs copied into the buffers, and the
graph replayed. Padding rows write their keys into a scratch block that the block manager
never hands out (:data:`PAD_BLOCKS` extra blocks at the end of the cache) and attend only
that one key, so they never touch a real context's KV.

Only steps in which every item decodes one token, without a shared-prefix group, qualify;
every other step runs eagerly. Nothing in the captured region may wait for the host, so the
attention backend must read no tensor values on the host (the Triton backend passes
``check_values=False`` to its kernels). On an H200 a graph step ran 4-9x faster than the
eager one and than transformers' (``benchmarks/gpu_decode_step.py``, docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from bisect import bisect_left

import torch

from parrot.engines.builtin.attention.base import AttentionBatch, DecodeGroup
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, stage_decodes, takes_shared_prefix
from parrot.engines.builtin.context_pool import ContextPool
from parrot.engines.builtin.model.llama import LlamaForCausalLM

log = logging.getLogger(__name__)

PAD_BLOCKS = 1  # scratch blocks past the block manager's, written by padding rows only
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64)
IDS, POSITIONS, SLOTS, KV_LENS = range(4)  # rows of the static input vectors (stage_decodes)


def graph_batch_sizes(
    sizes: tuple[int, ...], device: torch.device, model: LlamaForCausalLM
) -> tuple[int, ...]:
    """The batch sizes to capture: none off CUDA, off the Triton backend (whose kernels check
    no values on the device) or with sliding-window layers (their masks are built per step)."""
    if device.type != "cuda" or model.layers[0].self_attn.backend.name != "triton" or model.windows:
        return ()
    return tuple(sorted(set(sizes)))


def capture_decode_graphs(
    model: LlamaForCausalLM,
    pool: ContextPool,
    max_len: int,
    sizes: tuple[int, ...],
    policy: SharedPrefixPolicy,
) -> DecodeGraphs | None:
    """The graphs of ``sizes`` (None for none); None, with a warning, when capture fails (an
    operation in the step that waits for the host): the engine then runs every step eagerly."""
    if not sizes:
        return None
    try:
        return DecodeGraphs(model, pool, max_len, sizes, policy)
    except RuntimeError as error:
        log.warning("decode steps run without CUDA graphs: capturing one failed: %s", error)
        torch.cuda.synchronize()
        return None


class DecodeGraphs:
    """Static buffers and one captured decode step per batch size; the runner's graph path.

    ``capture=False`` keeps the same padded static inputs but runs the step eagerly: the
    graph path without CUDA, for tests on the CPU.
    """

    kind = "graph"

    def __init__(
        self,
        model: LlamaForCausalLM,
        pool: ContextPool,  # its KV cache holds PAD_BLOCKS blocks past its block manager's
        max_len: int,  # the longest context (in tokens, the new one included) a graph serves
        sizes: tuple[int, ...],
        policy: SharedPrefixPolicy,
        capture: bool = True,
    ) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f"graph batch sizes must be positive, got {sizes}")
        block_size = pool.block_size
        self.pad_block = pool.blocks.num_blocks
        if pool.kv_cache.shape[2] < (self.pad_block + PAD_BLOCKS) * block_size:
            raise ValueError("the KV cache has no scratch block for the graphs' padding rows")
        self.model = model
        self.kv_cache = pool.kv_cache
        self.block_size = block_size
        self.policy = policy
        self.sizes = tuple(sorted(set(sizes)))
        self.width = -(-max_len // block_size)  # block table columns
        self.max_len = self.width * block_size
        device = self.kv_cache.device
        biggest = self.sizes[-1]
        self.masks = model.layers[0].self_attn.backend.name != "triton"  # the torch backend reads them
        pin = device.type == "cuda"
        self._staged_vectors = torch.zeros(4, biggest, dtype=torch.long, pin_memory=pin)
        self._staged_table = torch.zeros(biggest, self.width, dtype=torch.long, pin_memory=pin)
        self._vectors_np = self._staged_vectors.numpy()
        self._table_np = self._staged_table.numpy()
        self._pad(0, biggest)
        self.vectors = self._staged_vectors.to(device)  # ids, positions, slots, kv_lens
        self.table = self._staged_table.to(device)
        self.rows = torch.arange(biggest, device=device)
        self.key_positions = torch.arange(self.max_len, device=device)
        self._copied = torch.cuda.Event() if pin else None  # the staging buffers were read
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture()

    # -- the step --------------------------------------------------------------------------
    def bucket(self, n: int) -> int:
        """The smallest captured size that holds ``n`` sequences."""
        return self.sizes[bisect_left(self.sizes, n)]

    def fits(self, items: list[StepItem]) -> bool:
        """Whether a graph runs this step: only single-token decodes that fit the buffers,
        and no shared prefix the eager path would attend once for the whole group."""
        if not items or len(items) > self.sizes[-1]:
            return False
        if any(item.num_tokens != 1 or item.start >= self.max_len for item in items):
            return False
        return not takes_shared_prefix(items, self.block_size, self.policy, self.kv_cache.device)

    @torch.inference_mode()
    def run(self, items: list[StepItem]) -> torch.Tensor:
        """The items' final-normed hidden rows [len(items), hidden], a copy (contexts keep views)."""
        n = len(items)
        size = self.bucket(n)
        if self._copied is not None and not self._copied.query():
            self._copied.synchronize()  # the last step's copies must leave the staging buffers
        stage_decodes(items, self.block_size, self._vectors_np, self._table_np)
        self._pad(n, size)
        self.vectors.copy_(self._staged_vectors, non_blocking=True)
        self.table[:size].copy_(self._staged_table[:size], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        if size in self._graphs:
            self._graphs[size].replay()
            out = self._outputs[size]
        else:
            out = self._forward(size)
        return out[:n].clone()

    def _pad(self, start: int, end: int) -> None:
        """Rows ``start:end`` decode token 0 at position 0 into the scratch block."""
        vec = self._vectors_np
        vec[IDS, start:end] = 0
        vec[POSITIONS, start:end] = 0
        vec[SLOTS, start:end] = self.pad_block * self.block_size
        vec[KV_LENS, start:end] = 1
        self._table_np[start:end, 0] = self.pad_block

    def _forward(self, size: int) -> torch.Tensor:
        """The model over the first ``size`` rows of the static buffers: what a graph records."""
        v = self.vectors
        kv_lens = v[KV_LENS, :size]
        if self.masks:
            valid = (self.key_positions[None, :] < kv_lens[:, None])[:, None, None, :]
            bias = torch.zeros(valid.shape, device=valid.device).masked_fill_(~valid, float("-inf"))
        else:  # the Triton kernels bound keys by kv_lens and read no mask
            valid = bias = self.key_positions.new_empty(size, 1, 1, 0)
        decode = DecodeGroup(
            token_rows=self.rows[:size],
            block_table=self.table[:size],
            kv_valid=valid,
            kv_bias=bias,
            kv_lens=kv_lens,
            block_size=self.block_size,
        )
        batch = AttentionBatch(
            num_tokens=size,
            block_size=self.block_size,
            slot_mapping=v[SLOTS, :size],
            decode=decode,
            prefills=(),
            shared_groups=(),
        )
        return self.model(v[IDS, :size], v[POSITIONS, :size], batch, self.kv_cache)

    # -- capture ---------------------------------------------------------------------------
    @torch.inference_mode()
    def _capture(self) -> None:
        """Record every size, largest first, in one memory pool (one graph runs at a time).

        The buffers hold padding rows only, so warm-up and capture write the scratch block.
        """
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # compiles the kernels outside the capture
                for _ in range(2):
                    self._forward(size)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self._outputs[size] = self._forward(size)
            self._graphs[size] = graph
        torch.cuda.synchronize()
        log.info("captured decode graphs for batch sizes %s", ", ".join(map(str, self.sizes)))
