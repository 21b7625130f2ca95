"""xgrammar against llguidance on this CPU, with the bundled model's tokenizer (issue 21).

    python benchmarks/grammar_libraries.py [--rounds 3]

What the builtin engine needs of a grammar library, measured for both:

- set-up: the tokenizer's vocabulary read once per engine;
- compile: a typical JSON schema (an object with nested fields, an array and an enum),
  compiled cold (no cache), median of several compiles;
- mask: per decode step, computing the allowed-token bitmask of every constrained row,
  applying it to float32 logits [rows, vocab] and advancing each row's matcher by its token,
  at batch 1 and 16 (16 rows in one call: xgrammar's ``BatchGrammarMatcher``, llguidance's
  ``fill_next_token_bitmask_par``). The rows follow the tokens of a valid instance, so the
  states are those of a real generation.

The two sides alternate each round; the report is the median (min-max) of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "priority": {"enum": ["low", "medium", "high"]},
        "estimate_hours": {"type": "integer", "minimum": 0},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name", "email"],
            "additionalProperties": False,
        },
        "steps": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    },
    "required": ["title", "priority", "estimate_hours", "owner", "steps"],
    "additionalProperties": False,
}
INSTANCE = {
    "title": "Ship structured outputs",
    "priority": "high",
    "estimate_hours": 40,
    "owner": {"name": "Ada Lovelace", "email": "ada@example.org"},
    "steps": ["pick the library", "mask the logits", "jump forward", "write the docs"],
}


def _tokenizer():
    import transformers

    from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder

    folder = resolve_model_folder(None, default_cache_dir())  # the bundled model
    return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Xgrammar:
    name = "xgrammar"

    def __init__(self, hf) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.vocab = len(hf)
        start = time.perf_counter()
        self.info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab)
        self.setup_s = time.perf_counter() - start

    def compile(self, schema: str):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))

    def mask_run(self, compiled, tokens: list[int], rows: int) -> float:
        xgr = self.xgr
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
        batch = xgr.BatchGrammarMatcher() if rows > 1 else None
        bitmask = xgr.allocate_token_bitmask(rows, self.vocab)
        logits = torch.randn(rows, self.vocab)
        start = time.perf_counter()
        for token in tokens:
            if batch is not None:
                batch.batch_fill_next_token_bitmask(matchers, bitmask)
            else:
                matchers[0].fill_next_token_bitmask(bitmask, 0)
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            for m in matchers:
                if not m.accept_token(token):
                    raise SystemExit("xgrammar refused a token of the valid instance")
        return (time.perf_counter() - start) / len(tokens)


class Llguidance:
    name = "llguidance"

    def __init__(self, hf) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.lt = llguidance.torch
        self.vocab = len(hf)
        start = time.perf_counter()
        self.tok = llguidance.hf.from_tokenizer(hf, n_vocab=self.vocab)
        self.setup_s = time.perf_counter() - start
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: str):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = self.llg.LLMatcher(self.tok, grammar)  # llguidance compiles lazily: force it
        bitmask = self.lt.allocate_token_bitmask(1, self.vocab)
        self.lt.fill_next_token_bitmask(matcher, bitmask, 0)
        if matcher.is_error():
            raise SystemExit(matcher.get_error())
        return grammar

    def mask_run(self, grammar, tokens: list[int], rows: int) -> float:
        lt = self.lt
        matchers = [self.llg.LLMatcher(self.tok, grammar) for _ in range(rows)]
        bitmask = lt.allocate_token_bitmask(rows, self.vocab)
        logits = torch.randn(rows, self.vocab)
        start = time.perf_counter()
        for token in tokens:
            if rows > 1:
                rows_ = [(m, i) for i, m in enumerate(matchers)]
                lt.fill_next_token_bitmask_par(self.executor, rows_, bitmask)
            else:
                lt.fill_next_token_bitmask(matchers[0], bitmask, 0)
            lt.apply_token_bitmask_inplace(logits, bitmask)
            for m in matchers:
                if not m.consume_token(token):
                    raise SystemExit(f"llguidance refused a token of the valid instance: {m.get_error()}")
        return (time.perf_counter() - start) / len(tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compiles", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    hf = _tokenizer()
    schema = json.dumps(SCHEMA)
    tokens = hf.encode(json.dumps(INSTANCE, separators=(",", ":")), add_special_tokens=False)
    libs = [Xgrammar(hf), Llguidance(hf)]
    for lib in libs:  # warm-up: thread pools start, lazy tables fill
        lib.mask_run(lib.compile(schema), tokens, 16)
    results: dict[str, dict[str, list[float]]] = {lib.name: {} for lib in libs}
    for round_ in range(args.rounds):
        for lib in libs if round_ % 2 == 0 else libs[::-1]:
            r = results[lib.name]
            compile_s = [_timed(partial(lib.compile, schema)) for _ in range(args.compiles)]
            r.setdefault("compile_ms", []).append(1000 * statistics.median(compile_s))
            compiled = lib.compile(schema)
            for rows in (1, 16):
                r.setdefault(f"mask_us_b{rows}", []).append(1e6 * lib.mask_run(compiled, tokens, rows))
    print(f"schema: {len(schema)} characters; instance: {len(tokens)} tokens; vocab {len(hf)}")
    print(
        "| library | tokenizer set-up, ms | compile, ms | mask + apply + advance per step, batch 1, µs "
        "| per step, batch 16, µs | per row at batch 16, µs |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for lib in libs:
        r = results[lib.name]

        def cell(key: str, scale: float = 1.0, r=r) -> str:
            values = [v / scale for v in r[key]]
            return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"

        print(
            f"| {lib.name} | {1000 * lib.setup_s:.0f} | {cell('compile_ms')} | {cell('mask_us_b1')} "
            f"| {cell('mask_us_b16')} | {cell('mask_us_b16', 16)} |"
        )


if __name__ == "__main__":
    main()
