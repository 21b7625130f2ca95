"""GGUF files of the families beyond Llama/Mistral/Qwen2 (tests' gguf_files.py writes them, as
llama.cpp does): logits and greedy tokens against transformers, the file's own weight
format, the rope settings the conversion restores, another architecture refused."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import CHUNKS, FAMILIES, GEMMA, GGUF_FAMILIES, TOKENS, our_greedy, our_logits, random_hf
from gguf_files import hf_from_gguf, write_gguf
from test_model_correctness import SMALL, run_chunks

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.kv_cache import allocate_kv_cache
from parrot.engines.builtin.model.build import build_model
from parrot.engines.builtin.model.loader import resolve_model_folder
from parrot.engines.builtin.model.model_config import ModelConfig
from parrot.engines.builtin.model.quant import Int8Linear
from parrot.engines.protocol.errors import ModelLoadError


@pytest.fixture(scope="module", params=sorted(GGUF_FAMILIES))
def gguf_family(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"gguf-{request.param}")
    path = write_gguf(random_hf(GGUF_FAMILIES[request.param]()), folder / f"tiny-{request.param}.gguf")
    return path, hf_from_gguf(path), resolve_model_folder(path, folder / "cache")


def test_gguf_logits_and_greedy_tokens_match_transformers(gguf_family):
    path, hf, folder = gguf_family
    assert ModelConfig.from_folder(folder).name == path.stem
    tokens = torch.randint(0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
        greedy = hf.generate(
            tokens[None, :6], do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=0
        )
    torch.testing.assert_close(our_logits(folder, tokens.tolist(), CHUNKS), expected, atol=2e-4, rtol=2e-4)
    assert our_greedy(folder, tokens[:6].tolist(), 16) == greedy[0, 6:].tolist()


def test_gguf_weight_format_reads_each_family_s_tensors(gguf_family):
    """--weights gguf: the file's own tensors (float32 here, so int8), fused names (Phi-3) and
    no llama row permutation (these architectures store q/k as they are)."""
    path, _, folder = gguf_family
    mc = ModelConfig.from_folder(folder)
    config = EngineConfig(model=str(path), weights="gguf", dtype="float32")
    backend = create_backend("torch", mc.num_heads, mc.num_kv_heads, mc.head_dim)
    model = build_model(config, mc, folder, backend)
    assert isinstance(model.layers[0].self_attn.qkv_proj, Int8Linear)
    cache = allocate_kv_cache(mc, 64, 4, torch.float32, torch.device("cpu"))
    pool = ContextPool(BlockManager(64, 4), cache)
    tokens = torch.randint(
        0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    pool.contexts[1] = ctx = Context(context_id=1, token_ids=tokens, materialized=True)
    got = run_chunks(model, pool, ctx, CHUNKS)
    exact = our_logits(folder, tokens, CHUNKS)
    error = ((got - exact).abs().max() / exact.abs().max()).item()
    assert 0 < error < 0.025  # test_weight_formats' int8 bound


RESTORED = {  # rope settings transformers' GGUF loader drops, which the conversion restores
    "phi4-mini-partial-longrope": FAMILIES["phi4-mini-partial-longrope"],
    "gemma3-linear-rope": lambda: transformers.Gemma3TextConfig(
        **{**GEMMA, "layer_types": None, "num_hidden_layers": 6},  # layer 6 is global
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
}


@pytest.mark.parametrize("name", sorted(RESTORED))
def test_gguf_conversion_keeps_the_checkpoint_s_rope(name, tmp_path):
    """A GGUF of Phi-4-mini (partial rotary, long-rope) or Gemma 3 (linear rope on its global
    layers) runs as the checkpoint it was made from."""
    hf = random_hf(RESTORED[name]())
    folder = resolve_model_folder(write_gguf(hf, tmp_path / f"{name}.gguf"), tmp_path / "cache")
    tokens = torch.randint(0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens[None]).logits[0]
    torch.testing.assert_close(our_logits(folder, tokens.tolist(), CHUNKS), expected, atol=2e-4, rtol=2e-4)


def test_a_gguf_of_another_architecture_is_refused_before_conversion(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "tiny-gpt2.gguf"
    writer = GGUFWriter(str(path), "gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"unsupported GGUF architecture 'gpt2'.*qwen3.*phi3.*gemma3"):
        resolve_model_folder(path, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # nothing half converted
