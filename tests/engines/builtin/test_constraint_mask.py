"""The step's token masks (engines/builtin/constraints.py) against a reference built from
llguidance's own bitmask, bit by bit: constrained rows masked, free rows untouched, on the
numpy path (float32 on the CPU) and the torch path (other dtypes, inference tensors)."""

from __future__ import annotations

import llguidance
import llguidance.hf
import llguidance.torch
import numpy as np
import pytest
import torch
import transformers

from parrot.engines.builtin.constraints import Constraint, ConstraintMasker
from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder
from parrot.engines.protocol.grammar import to_grammar
from parrot.wire.formats import OutputFormat

EOS = 2  # the bundled model's


@pytest.fixture(scope="module")
def hf():
    folder = resolve_model_folder(None, default_cache_dir())
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


@pytest.fixture(scope="module")
def templates(hf):
    tok = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=[EOS])
    formats = [
        OutputFormat(json_schema={"type": "object", "properties": {"story": {"type": "string"}}}),
        OutputFormat(choice=["yes", "no"]),
        OutputFormat(regex=r"\d+"),
    ]
    return [llguidance.LLMatcher(tok, to_grammar(f), log_level=0) for f in formats]


def allowed_by(constraint: Constraint, vocab: int) -> torch.Tensor:  # [vocab] bool
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)  # [1, words]
    llguidance.torch.fill_next_token_bitmask(constraint.matcher, bitmask, 0)
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[0, :vocab]
    return torch.from_numpy(bits.astype(bool))


def batch(hf, templates) -> list[Constraint | None]:
    rows: list[Constraint | None] = [Constraint(templates[0]), None, Constraint(templates[1])]
    rows += [Constraint(templates[2]), None]
    for token in hf.encode('{"story": "Once', add_special_tokens=False):
        rows[0].consume(token)
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_constrained_rows_are_masked_bit_for_bit_and_free_rows_untouched(hf, templates, dtype):
    vocab = len(hf)
    rows = batch(hf, templates)
    logits = torch.randn(len(rows), vocab).to(dtype)  # [rows, vocab]
    expected = logits.clone()
    for i, constraint in enumerate(rows):
        if constraint is not None:
            expected[i][~allowed_by(constraint, vocab)] = float("-inf")
    masked = ConstraintMasker(frozenset([EOS])).apply(logits, rows)
    assert torch.equal(masked, expected)
    assert (masked[2] > float("-inf")).sum() < 10  # "yes" / "no" and their prefixes only
    assert torch.isfinite(masked[1]).all() and torch.isfinite(masked[4]).all()


def test_inference_tensors_of_the_model_step_are_masked(hf, templates):
    rows = batch(hf, templates)[2:4]
    with torch.inference_mode():
        logits = torch.randn(2, len(hf)).bfloat16()  # [2, vocab], as the model's step returns
    masked = ConstraintMasker(frozenset([EOS])).apply(logits, rows)
    assert (masked > float("-inf")).sum(dim=1).tolist() == [int(allowed_by(r, len(hf)).sum()) for r in rows]


def test_a_matcher_in_an_error_state_may_only_end(hf, templates):
    broken = Constraint(templates[1])
    assert not broken.matcher.consume_token(hf.encode("zebra", add_special_tokens=False)[0])
    masked = ConstraintMasker(frozenset([EOS])).apply(torch.randn(1, len(hf)), [broken])
    assert torch.nonzero(masked[0] > float("-inf")).flatten().tolist() == [EOS]
