"""Decode steps through the CUDA-graph path: which steps qualify, how they are padded, and
that the padded step computes what the eager step computes without touching real KV.

On the CPU the graph path runs its padded static inputs eagerly (``capture=False``); the
last test captures and replays real graphs and runs only where CUDA is.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_decode_step import QUICK, Side, hf_model
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem
from parrot.engines.builtin.context_pool import Context
from parrot.engines.builtin.cuda_graphs import DecodeGraphs, capture_decode_graphs, graph_batch_sizes
from parrot.engines.builtin.model_runner import ModelRunner

PROMPT = 37  # not a whole number of blocks


@pytest.fixture(scope="module")
def side() -> Side:
    """A tiny random model's runner pieces, six contexts of PROMPT computed tokens (+1 to decode)."""
    torch.manual_seed(0)
    hf = hf_model(QUICK, torch.device("cpu"), torch.float32)
    side = Side(hf, "torch", torch.device("cpu"), torch.float32, num_blocks=64)
    side.prefill(torch.randint(0, QUICK["vocab_size"], (6, PROMPT)), torch.arange(6) + 7)
    return side


def graphs(side: Side, sizes=(1, 2, 4, 8), max_len: int = 256, policy=None) -> DecodeGraphs:
    return DecodeGraphs(side.model, side.pool, max_len, sizes, policy or side.policy, capture=False)


def test_a_step_is_padded_to_the_next_captured_size(side):
    g = graphs(side, sizes=(8, 1, 4, 2, 4))
    assert g.sizes == (1, 2, 4, 8)
    assert [g.bucket(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_only_single_token_decodes_that_fit_qualify(side):
    g = graphs(side, sizes=(1, 2, 4), max_len=PROMPT + 1)
    items = side.decode_items(3)
    assert g.fits(items)
    assert not g.fits([])
    assert not g.fits(side.decode_items(5))  # more rows than the largest graph
    prefill = StepItem(side.contexts[0], 0, PROMPT, sample=False)
    assert not g.fits([*items[:2], prefill])
    stored = StepItem(side.contexts[0], PROMPT + 1, 0, sample=True)  # samples its stored state
    assert not g.fits([*items[:2], stored])
    assert not graphs(side, max_len=32).fits(items)  # the new key falls past the table's two blocks


def test_a_step_that_shares_a_prefix_runs_eagerly(side):
    parent = side.contexts[0]
    forks = []
    for cid in (100, 101):
        fork = Context(context_id=cid, parent=parent, parent_id=parent.context_id)
        side.pool.contexts[cid] = fork
        side.pool.materialize(fork)
        fork.token_ids.append(5)
        assert side.pool.ensure_blocks(fork, len(fork.token_ids))
        forks.append(fork)
    try:
        items = [StepItem(f, len(f.token_ids) - 1, 1, sample=True) for f in forks]
        always = SharedPrefixPolicy(min_saved_tokens=0, min_prefix_tokens=1)
        assert not graphs(side, policy=always).fits(items)
        assert graphs(side, policy=SharedPrefixPolicy(enabled=False)).fits(items)
    finally:
        for fork in forks:
            side.pool.free(fork)


@pytest.mark.parametrize("batch", [1, 3, 6])
def test_the_padded_step_computes_the_eager_step(side, batch):
    items = side.decode_items(batch)
    eager = side.eager.run(items)
    real = side.pool.blocks.num_blocks * side.pool.block_size  # slots past it: the scratch block
    side.pool.kv_cache[:, :, real:] = 0
    cache = side.pool.kv_cache.clone()
    runner = side.graph_runner((1, 2, 4, 8), 256, capture=False)
    padded = runner.run(items)
    torch.testing.assert_close(padded.logits, eager.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded.last_hidden, eager.last_hidden, rtol=1e-5, atol=1e-5)
    assert not padded.shared_prefix
    # Padding rows wrote the scratch block only; real slots hold what the eager step wrote.
    torch.testing.assert_close(side.pool.kv_cache[:, :, :real], cache[:, :, :real], rtol=1e-5, atol=1e-6)
    if runner.whole_step.bucket(batch) > batch:
        assert side.pool.kv_cache[:, :, real].abs().sum() > 0  # a padding row wrote its one key


def test_the_padded_step_computes_the_eager_step_on_the_triton_kernels():
    """The inputs the graphs use (a table as wide as max_len, no masks) on the Triton backend,
    interpreted on the CPU where there is no GPU."""
    torch.manual_seed(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    side = Side(hf_model(QUICK, device, torch.float32), "triton", device, torch.float32, num_blocks=32)
    side.prefill(torch.randint(0, QUICK["vocab_size"], (3, PROMPT), device=device), torch.arange(3) + 7)
    items = side.decode_items(3)
    eager = side.eager.run(items)
    padded = side.graph_runner((1, 4), 256, capture=False).run(items)
    assert padded.logits.shape == eager.logits.shape
    torch.testing.assert_close(padded.logits, eager.logits, rtol=1e-4, atol=1e-4)


def test_the_rows_returned_are_a_copy_the_next_step_leaves_alone(side):
    runner = side.graph_runner((1, 2, 4, 8), 256, capture=False)
    first = runner.run(side.decode_items(2)).last_hidden
    kept = first.clone()
    runner.run(side.decode_items(4)[2:])
    assert torch.equal(first, kept)


def test_graphs_are_captured_on_cuda_with_the_triton_backend_only(side):
    # Imported here: the engine's config pulls in the grammar libraries, which a bare GPU
    # machine running the CUDA test below may lack.
    pytest.importorskip("llguidance")
    from parrot.engines.builtin.engine_config import EngineConfig

    assert graph_batch_sizes((4, 1, 2), torch.device("cpu"), side.model) == ()
    assert EngineConfig().cuda_graph_batch_sizes == (1, 2, 4, 8, 16, 32, 64)
    with pytest.raises(ValueError, match="positive"):
        EngineConfig(cuda_graph_batch_sizes=(0, 4))
    on_gpu = EngineConfig(device="cuda")  # nothing touches the device here
    assert (on_gpu.weights, on_gpu.torch_dtype()) == ("exact", torch.bfloat16)
    with pytest.raises(ValueError, match="graph batch sizes"):
        DecodeGraphs(side.model, side.pool, 256, (), side.policy, capture=False)


def test_the_cli_flag_sets_the_sizes():
    pytest.importorskip("llguidance")
    from parrot.cli.engine_cmd import config_from_args
    from parrot.cli.main import build_parser

    def sizes(*flags: str) -> tuple[int, ...]:
        return config_from_args(build_parser().parse_args(["engine", *flags])).cuda_graph_batch_sizes

    assert sizes() == (1, 2, 4, 8, 16, 32, 64)
    assert sizes("--cuda-graphs", "1,8,64") == (1, 8, 64)
    assert sizes("--cuda-graphs", "off") == ()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_graph_replay_equals_the_eager_step_on_cuda():
    device = torch.device("cuda")
    torch.manual_seed(0)
    dims = dict(QUICK, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    hf = hf_model(dims, device, torch.bfloat16)
    side = Side(hf, "triton", device, torch.bfloat16, num_blocks=64)
    side.prefill(torch.randint(0, dims["vocab_size"], (6, PROMPT), device=device), torch.arange(6) + 7)
    assert graph_batch_sizes((1, 2, 4, 8), device, side.model) == (1, 2, 4, 8)
    graphs = capture_decode_graphs(side.model, side.pool, 256, (1, 2, 4, 8), side.policy)  # as the engine
    assert graphs is not None and sorted(graphs._graphs) == [1, 2, 4, 8]
    runner = ModelRunner(side.model, side.pool, side.policy, device, graphs)
    for batch in (1, 3, 6, 1):
        items = side.decode_items(batch)
        eager = side.eager.run(items)
        replayed = runner.run(items)
        torch.testing.assert_close(replayed.logits, eager.logits, rtol=2e-2, atol=2e-2)
        assert (replayed.logits.argmax(-1) == eager.logits.argmax(-1)).float().mean() >= 0.8
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # a host sync inside the step raises
    try:
        step = runner.run(side.decode_items(3))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.testing.assert_close(step.logits, side.eager.run(side.decode_items(3)).logits, rtol=2e-2, atol=2e-2)


def test_the_decode_step_benchmark_runs_in_its_quick_mode(monkeypatch, capsys):
    """``benchmarks/gpu_decode_step.py --quick`` on the CPU (padded steps, no graphs), so the
    GPU benchmark cannot rot between GPU sessions (it once failed on a renamed attribute)."""
    from benchmarks import gpu_decode_step

    monkeypatch.setattr("sys.argv", ["gpu_decode_step.py", "--quick", "--rounds", "1", "--reps", "1"])
    gpu_decode_step.main()
    table = capsys.readouterr().out.split("| model | batch |")[-1]  # the printed table
    rows = [line for line in table.splitlines() if line.startswith("| tiny |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "3", "4"]
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        assert float(cells[8]) < 1e-5, row  # max abs(padded - eager): the same step
        assert cells[10] == "100%", row  # the same greedy tokens as transformers
