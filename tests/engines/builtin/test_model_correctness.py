"""Our model code against transformers: logits on random Llama/Mistral/Qwen2 configs, greedy
generation on the real default model through /generate and /v1/completions (in the exact
weight mode, which the tests' shared engine runs: the default on the CPU, the GGUF's own
quantization, is close to transformers, not identical; test_weight_formats.py bounds it)."""

from __future__ import annotations

import pytest
import torch
import transformers

from parrot.engines.builtin.attention import create_backend
from parrot.engines.builtin.batch import SharedPrefixPolicy, StepItem, build_step
from parrot.engines.builtin.block_manager import BlockManager
from parrot.engines.builtin.context_pool import Context, ContextPool
from parrot.engines.builtin.kv_cache import allocate_kv_cache
from parrot.engines.builtin.model.llama import LlamaForCausalLM
from parrot.engines.builtin.model.loader import load_state_dict
from parrot.engines.builtin.model.model_config import ModelConfig

SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, tie_word_embeddings=False),
    "llama-tied-llama3-rope": lambda: transformers.LlamaConfig(
        **SMALL,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "llama-attention-bias-mha": lambda: transformers.LlamaConfig(
        **{**SMALL, "num_key_value_heads": 4}, attention_bias=True
    ),
    "mistral": lambda: transformers.MistralConfig(**SMALL, sliding_window=None),
    "qwen2": lambda: transformers.Qwen2Config(**SMALL, tie_word_embeddings=True),
    "qwen2-linear-rope": lambda: transformers.Qwen2Config(
        **SMALL, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
}


def load_ours(folder, block_size=4, num_blocks=64, backend="torch"):
    config = ModelConfig.from_folder(folder)
    backend = create_backend(backend, config.num_heads, config.num_kv_heads, config.head_dim)
    model = LlamaForCausalLM(config, backend)
    model.load_hf_state_dict(load_state_dict(folder, "cpu", torch.float32))
    cache = allocate_kv_cache(config, num_blocks, block_size, torch.float32, torch.device("cpu"))
    pool = ContextPool(BlockManager(num_blocks, block_size), cache)
    return model.eval(), pool


def run_chunks(model, pool, ctx: Context, chunks: list[int]) -> torch.Tensor:
    """Feed the context's tokens in chunks; return logits of every token [len, vocab]."""
    out = []
    for n in chunks:
        item = StepItem(ctx, ctx.num_computed, n, sample=False)
        assert pool.ensure_blocks(ctx, ctx.num_computed + n)
        step = build_step([item], pool.block_size, SharedPrefixPolicy(), torch.device("cpu"))
        hidden = model(step.input_ids, step.positions, step.attention, pool.kv_cache)
        out.append(model.compute_logits(hidden))
        ctx.num_computed += n
    return torch.cat(out)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(name, tmp_path):
    torch.manual_seed(0)
    hf_config = CONFIGS[name]()
    hf = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    if getattr(hf_config, "attention_bias", False):
        with torch.no_grad():  # random biases, so a missing bias would show
            for module in hf.modules():
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    module.bias.normal_()
    hf.save_pretrained(tmp_path)
    model, pool = load_ours(tmp_path)
    tokens = torch.randint(0, SMALL["vocab_size"], (1, 45)).tolist()[0]
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    ctx = Context(context_id=1, token_ids=list(tokens), materialized=True)
    pool.contexts[1] = ctx
    # Chunked prefill, then single-token decode steps, over blocks of 4 tokens.
    got = run_chunks(model, pool, ctx, [17, 20, 1, 1, 1, 1, 1, 1, 1, 1])
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=2e-4)


@pytest.fixture(scope="module")
def hf_default(engine):
    model = transformers.AutoModelForCausalLM.from_pretrained(engine.model_folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(engine.model_folder)
    return model, tokenizer


PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "def fibonacci(n):\n",
]


def hf_greedy(model, tokenizer, prompt: str, n: int, eos: set[int]) -> list[int]:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, max_new_tokens=n, pad_token_id=tokenizer.eos_token_id)
    new = out[0, ids.shape[1] :].tolist()
    for i, t in enumerate(new):
        if t in eos:
            return new[:i]
    return new


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generation_matches_transformers(prompt, hf_default, client, ids, engine):
    """Acceptance 1: /generate and /v1/completions are token-for-token transformers' greedy."""
    model, tokenizer = hf_default
    assert engine.config.weights == "exact"
    expected = hf_greedy(model, tokenizer, prompt, 32, set(engine.core.eos_token_ids))
    cid = next(ids)
    client.post("/fill", json={"context_id": cid, "text": prompt})
    r = client.post("/generate", json={"context_id": cid, "sampling": {"max_tokens": 32, "temperature": 0}})
    client.post("/free_context", json={"context_id": cid})
    assert r.json()["token_ids"] == expected
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 32, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tokenizer.decode(expected, skip_special_tokens=True)
