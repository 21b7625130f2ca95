"""Float32 linears on numpy's BLAS (``--cpu-matmul``): the same model, token for token.

The exact mode may multiply its small steps on BLAS instead of torch (a different
summation order, not different arithmetic), so its parity with transformers is checked on
that path too: logits on the random configs with steps routed both ways, and greedy
generation on the real default model.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from test_model_correctness import CONFIGS, PROMPTS, SMALL, hf_greedy, run_chunks

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.kv_cache import allocate_kv_cache
from parrot.engines.builtin.model.blas_linear import BlasLinear, MatmulRoute
from parrot.engines.builtin.model.build import build_model
from parrot.engines.builtin.model.model_config import ModelConfig


def build(folder, cpu_matmul: str, blas_rows: int = 64, blas_keys: int = 8192, num_blocks: int = 128):
    config = EngineConfig(weights="exact", cpu_matmul=cpu_matmul, blas_rows=blas_rows, blas_keys=blas_keys)
    mc = ModelConfig.from_folder(folder)
    backend = create_backend("torch", mc.num_heads, mc.num_kv_heads, mc.head_dim)
    model = build_model(config, mc, folder, backend)
    cache = allocate_kv_cache(mc, num_blocks, 16, torch.float32, torch.device("cpu"))
    return model, ContextPool(BlockManager(num_blocks, 16), cache)


def routed_chunks(model, pool, ctx: Context, chunks: list[int]) -> tuple[torch.Tensor, list[bool]]:
    """run_chunks, with each chunk routed as the engine's runner routes a step of its rows."""
    route: MatmulRoute = model.matmul_route
    logits, used_blas = [], []
    try:
        for n in chunks:
            route.begin_step(n)
            used_blas.append(route.blas)
            logits.append(run_chunks(model, pool, ctx, [n]))
    finally:
        route.begin_step(route.max_rows + 1)  # back to torch and all its threads
    return torch.cat(logits), used_blas


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def random_folder(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param]()).eval()
    if getattr(hf.config, "attention_bias", False):
        with torch.no_grad():
            for module in hf.modules():
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    module.bias.normal_()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return folder, hf


def test_blas_steps_match_transformers_on_random_configs(random_folder):
    folder, hf = random_folder
    tokens = torch.randint(0, SMALL["vocab_size"], (1, 45), generator=torch.Generator().manual_seed(1))[0]
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
    # blas_rows 8: the two prefill chunks run on torch, the decode steps on BLAS
    model, pool = build(folder, "blas", blas_rows=8)
    assert all(isinstance(m, BlasLinear) for m in (model.layers[0].mlp.down_proj, model.packed_head))
    ctx = Context(context_id=1, token_ids=tokens.tolist(), materialized=True)
    pool.contexts[1] = ctx
    got, used_blas = routed_chunks(model, pool, ctx, [17, 20] + [1] * 8)
    assert used_blas == [False, False] + [True] * 8
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


def test_greedy_generation_on_blas_matches_transformers(engine):
    """The real default model, every step on BLAS: transformers' greedy tokens exactly."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(engine.model_folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(engine.model_folder)
    model, pool = build(engine.model_folder, "blas")
    eos = set(engine.core.eos_token_ids)
    for i, prompt in enumerate(PROMPTS):
        expected = hf_greedy(hf, tokenizer, prompt, 16, eos)
        ctx = Context(context_id=i + 1, token_ids=engine.tokenize(prompt), materialized=True)
        pool.contexts[ctx.context_id] = ctx
        got: list[int] = []
        n = len(ctx.token_ids)
        while len(got) < len(expected):
            logits, used_blas = routed_chunks(model, pool, ctx, [n])
            assert used_blas == [True]
            got.append(int(logits[-1].argmax()))
            ctx.token_ids.append(got[-1])
            n = 1
        assert got == expected, prompt
        pool.free(ctx)


def test_a_route_switches_torch_threads_per_step():
    threads = torch.get_num_threads()
    route = MatmulRoute(max_rows=4, max_keys=100, threads=threads)
    try:
        route.begin_step(4, 100)
        assert (route.blas, torch.get_num_threads()) == (True, 1)
        route.begin_step(5, 10)  # too many rows
        assert (route.blas, torch.get_num_threads()) == (False, threads)
        route.begin_step(1, 10)
        assert (route.blas, torch.get_num_threads()) == (True, 1)
        route.begin_step(1, 101)  # too many keys: attention wants torch's threads
        assert (route.blas, torch.get_num_threads()) == (False, threads)
    finally:
        torch.set_num_threads(threads)


def test_a_blas_linear_is_the_torch_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    route = MatmulRoute(max_rows=8, max_keys=100, threads=torch.get_num_threads())
    layer = BlasLinear(linear.weight, linear.bias, route)
    x = torch.randn(3, 96)
    with torch.inference_mode():
        on_torch = layer(x)  # the route starts on torch
        route.blas = True
        on_blas = layer(x)
    torch.testing.assert_close(on_blas, linear(x).detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(on_torch, linear(x).detach())


def test_torch_keeps_the_model_on_torch(engine):
    model, _ = build(engine.model_folder, "torch", num_blocks=4)
    assert model.matmul_route is None
    assert isinstance(model.layers[0].mlp.down_proj, torch.nn.Linear)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cpu_matmul": "mkl"}, "cpu_matmul must be one of auto, torch, blas"),
        ({"cpu_matmul": "blas", "dtype": "bfloat16"}, "float32 exact weights on the CPU"),
        ({"cpu_matmul": "blas", "weights": "int4"}, "float32 exact weights on the CPU"),
        ({"blas_rows": 0}, "blas_rows and blas_keys must be positive"),
        ({"blas_keys": 0}, "blas_rows and blas_keys must be positive"),
    ],
)
def test_bad_cpu_matmul_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**overrides)


def test_cli_and_environment_pass_the_choice(monkeypatch):
    from parrot.cli.engine_cmd import config_from_args
    from parrot.cli.main import build_parser

    args = build_parser().parse_args(["engine", "--cpu-matmul", "torch"])
    assert config_from_args(args).cpu_matmul == "torch"
    monkeypatch.setenv("PARROT_CPU_MATMUL", "blas")
    monkeypatch.setenv("PARROT_WEIGHTS", "exact")  # BLAS multiplies float32 exact weights only
    assert config_from_args(build_parser().parse_args(["engine"])).cpu_matmul == "blas"


def test_the_runner_routes_each_step_by_its_rows(engine):
    """Prefill steps past blas_rows run on torch with its threads, decode steps on BLAS
    until the context holds more than blas_keys keys."""
    from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem
    from parrot.engines.builtin.model_runner import ModelRunner

    threads = torch.get_num_threads()
    prompt = engine.tokenize("The lighthouse keeper wrote in his log. " * 3)
    model, pool = build(engine.model_folder, "blas", blas_rows=8, blas_keys=len(prompt) + 1)
    runner = ModelRunner(model, pool, SharedPrefixPolicy(), torch.device("cpu"))
    ctx = Context(context_id=1, token_ids=prompt, materialized=True)
    pool.contexts[1] = ctx
    seen = []
    try:
        for _ in range(3):
            assert pool.ensure_blocks(ctx, len(ctx.token_ids))
            n = len(ctx.token_ids) - ctx.num_computed
            output = runner.run([StepItem(ctx, ctx.num_computed, n, True)])
            pool.computed(ctx, len(ctx.token_ids), output.last_hidden[0])  # the postprocess step's part
            logits = output.logits
            seen.append((n, model.matmul_route.blas, torch.get_num_threads()))
            ctx.token_ids.append(int(logits[0].argmax()))
    finally:
        model.matmul_route.begin_step(9)
        torch.set_num_threads(threads)
    assert seen[0][0] > 8 and seen[0][1:] == (False, threads)
    # the first decode step attends len(prompt) + 1 keys, the second one more
    assert seen[1:] == [(1, True, 1), (1, False, threads)]


@pytest.mark.parametrize(("speedup", "routed"), [(1.0, False), (1.1, False), (1.2, True), (3.0, True)])
def test_auto_takes_blas_only_when_it_measures_faster(engine, monkeypatch, speedup, routed):
    from parrot.engines.builtin.model import build as build_module

    monkeypatch.setattr(build_module, "blas_speedup", lambda weight, threads: speedup)
    model, _ = build(engine.model_folder, "auto", num_blocks=4)
    assert (model.matmul_route is not None) == routed
    assert isinstance(model.packed_head, BlasLinear) == routed


def test_a_shared_prefix_counts_once_among_the_attended_keys():
    from types import SimpleNamespace

    from parrot.engines.builtin.batch import StepItem
    from parrot.engines.builtin.model_runner import attended_keys

    items = [StepItem(Context(context_id=i, token_ids=[1] * 101), 100, 1, True) for i in range(4)]
    items.append(StepItem(Context(context_id=9, token_ids=[1] * 20), 0, 20, False))  # a prefill
    plain = SimpleNamespace(shared_groups=())
    assert attended_keys(items, plain) == 4 * 101 + 20
    # the four decodes share 96 keys (6 blocks of 16): attended once, not four times
    group = SimpleNamespace(num_seqs=4, prefix_blocks=[0] * 6, block_size=16)
    shared = SimpleNamespace(shared_groups=(group,))
    assert attended_keys(items, shared) == 4 * 101 + 20 - 3 * 96
