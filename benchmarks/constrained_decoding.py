"""Constrained decoding in the builtin engine (issue 21): its cost per token, and what
jump-forward saves.

    python benchmarks/constrained_decoding.py [--rounds 3] [--tokens 64] [--quick]

1. Time per generated token, constrained against free, at batch 1 and 16: the same prompt,
   filled once and forked by every row (prefill excluded), greedy, ``max_tokens`` tokens per
   row on both sides. The constrained side is a JSON schema with one long string field
   (``minLength`` keeps it open for all the tokens) on an engine without jump-forward, so
   both sides take one decode step per token and the difference is the masking (fill the
   bitmask of every row, apply it, advance the matchers). Target: <= 1.15x.
2. Jump-forward on and off, batch 1, greedy, on an object schema with fixed keys, booleans
   and enums: engine steps (``/ping``'s ``steps``) and wall time per generation, the text
   checked to be the same. Target: >= 1.5x fewer steps.

The sides alternate each round; cells are the median (min-max) over the rounds. A
benchmark, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time

import torch

from parrot.engines.builtin.engine import BuiltinEngine
from parrot.engines.builtin.engine_config import EngineConfig
from parrot.engines.builtin.local_scheduler import SchedulerConfig
from parrot.wire.formats import OutputFormat
from parrot.wire.sampling import SamplingParams

PROMPT = "<|im_start|>user\nTell me about a lighthouse keeper, as JSON.<|im_end|>\n<|im_start|>assistant\n"
OPEN_STRING = {
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 4000}},
    "required": ["story"],
}
FIXED_KEYS = {
    "type": "object",
    "properties": {
        "first_name": {"type": "string", "maxLength": 12},
        "is_student": {"type": "boolean"},
        "country": {"enum": ["France", "Germany", "Japan", "United States of America"]},
        "favourite_colour": {"enum": ["red", "green", "blue"]},
        "has_pets": {"type": "boolean"},
        "employment_status": {"enum": ["employed", "unemployed", "retired"]},
    },
    "required": ["first_name", "is_student", "country", "favourite_colour", "has_pets", "employment_status"],
    "additionalProperties": False,
}

_ids = itertools.count(1)


def engine(jump_forward: bool, threads: int | None) -> BuiltinEngine:
    config = EngineConfig(
        kv_cache_bytes=512 * 2**20,
        scheduler=SchedulerConfig(max_batched_tokens=1024, max_running=32),
        jump_forward=jump_forward,
        num_threads=threads,
    )
    return BuiltinEngine(config)


async def decode_per_token(eng: BuiltinEngine, fmt: OutputFormat | None, rows: int, tokens: int) -> float:
    """Seconds per generated token (all rows' tokens over the wall time), prefill excluded."""
    parent = next(_ids)
    await eng.fill(parent, token_ids=eng.tokenize(PROMPT))
    sampling = SamplingParams(max_tokens=tokens, ignore_eos=True, format=fmt)
    children = [next(_ids) for _ in range(rows)]
    start = time.perf_counter()
    results = await asyncio.gather(*(eng.generate(c, sampling, parent) for c in children))
    seconds = time.perf_counter() - start
    for cid in (parent, *children):
        await eng.free_context(cid)
    generated = sum(len(r.token_ids) for r in results)
    if generated != rows * tokens:
        raise SystemExit(f"a row ended early ({generated} of {rows * tokens} tokens): not comparable")
    return seconds / generated


async def jump_forward_run(eng: BuiltinEngine, fmt: OutputFormat) -> tuple[int, float, str]:
    """Engine steps, seconds and text of one greedy constrained generation."""
    cid = next(_ids)
    before = eng.stats_now()["steps"]
    start = time.perf_counter()
    result = await eng.generate(
        cid, SamplingParams(max_tokens=128, format=fmt), token_ids=eng.tokenize(PROMPT)
    )
    seconds = time.perf_counter() - start
    steps = eng.stats_now()["steps"] - before
    await eng.free_context(cid)
    if result.finish_reason != "stop":
        raise SystemExit(f"the fixed-key object did not finish: {result.text!r}")
    return steps, seconds, result.text


def cell(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}–{max(v):.{digits}f})"


async def main_async(args: argparse.Namespace) -> None:
    plain = engine(jump_forward=False, threads=args.threads)
    jumping = engine(jump_forward=True, threads=args.threads)
    try:
        open_fmt = OutputFormat(json_schema=OPEN_STRING)
        fixed = OutputFormat(json_schema=FIXED_KEYS)
        # Warm-up: grammars compiled, lazy tables filled, thread pools started.
        await decode_per_token(plain, open_fmt, 2, 8)
        await decode_per_token(plain, None, 2, 8)
        await jump_forward_run(jumping, fixed)
        await jump_forward_run(plain, fixed)

        per_token: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.rounds):
            for rows in args.batches:
                sides = [("free", None), ("constrained", open_fmt)]
                for name, fmt in sides if round_ % 2 == 0 else sides[::-1]:
                    seconds = await decode_per_token(plain, fmt, rows, args.tokens)
                    per_token.setdefault((name, rows), []).append(seconds)
        jf: dict[str, dict[str, list[float]]] = {"on": {}, "off": {}}
        texts: dict[str, str] = {}
        for round_ in range(args.rounds):
            sides = [("on", jumping), ("off", plain)]
            for name, eng in sides if round_ % 2 == 0 else sides[::-1]:
                steps, seconds, text = await jump_forward_run(eng, fixed)
                jf[name].setdefault("steps", []).append(steps)
                jf[name].setdefault("seconds", []).append(seconds)
                texts[name] = text
    finally:
        plain.stop()
        jumping.stop()

    print(f"torch threads {torch.get_num_threads()}, {args.rounds} rounds, {args.tokens} tokens per row\n")
    print("| batch | free, ms/token | constrained, ms/token | constrained / free |")
    print("| ---: | ---: | ---: | ---: |")
    for rows in args.batches:
        free, con = per_token[("free", rows)], per_token[("constrained", rows)]
        ratios = [c / f for c, f in zip(con, free, strict=True)]
        print(f"| {rows} | {cell(free, 1000, 2)} | {cell(con, 1000, 2)} | {cell(ratios, digits=2)} |")
    print("\n| jump-forward | engine steps | wall time, ms | same text |")
    print("| --- | ---: | ---: | --- |")
    for name in ("off", "on"):
        r = jf[name]
        same = "yes" if texts["on"] == texts["off"] else "NO"
        print(f"| {name} | {cell(r['steps'])} | {cell(r['seconds'], 1000)} | {same} |")
    steps_ratio = statistics.median(jf["off"]["steps"]) / statistics.median(jf["on"]["steps"])
    time_ratio = statistics.median(jf["off"]["seconds"]) / statistics.median(jf["on"]["seconds"])
    print(f"\njump-forward: {steps_ratio:.2f}x fewer steps, {time_ratio:.2f}x less wall time")
    print(f"text: {texts['on']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per row in the per-token comparison")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads of each engine")
    ap.add_argument("--quick", action="store_true", help="1 round, 8 tokens, batches 1 and 4: checks it runs")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.tokens, args.batches = 1, 8, [1, 4]
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
