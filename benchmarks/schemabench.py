"""JSONSchemaBench (Geng et al., 2025) through Parrot and llama.cpp's server (issue 36 §3).

The schemas are those of ``guidance-ai/jsonschemabench`` (~9,500 real schemas in ten
subsets: GitHub by difficulty, Kubernetes, Snowplow, JSONSchemaStore, Washington Post,
GlaiveAI function calls), kept outside this repository and its tests:

    git clone https://github.com/guidance-ai/jsonschemabench /tmp/jsonschemabench
    python benchmarks/schemabench.py coverage --data /tmp/jsonschemabench/data
    python benchmarks/schemabench.py generate --data /tmp/jsonschemabench/data --per-subset 4
    python benchmarks/schemabench.py generate --data /tmp/jsonschemabench/data --per-subset 8 \
        --gguf "$(python benchmarks/tool_model.py)" --label qwen2.5-coder-0.5b

- ``coverage``: every schema of every subset through what a server checks before it
  generates (Parrot: the OpenAI request body, the size limit, llguidance's compile, the
  submit-time probe, the compile for the engine's vocabulary; no model run): accepted, or
  refused, counted by the first line of the reason.
- ``generate``: a seeded sample per subset sent as ``response_format`` ``json_schema`` to
  Parrot's ServeCore front (``parrot serve``, the bundled model) and to ``llama-server`` on the
  same GGUF, ``--concurrency`` at a time, each side in turn; every answer checked: valid JSON,
  schema-valid (``jsonschema_rs``, formats checked), cut by ``max_tokens``, refused (4xx, its
  reason), failed (5xx or no answer), and its seconds.

Both write their table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import signal
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import httpx
import jsonschema_rs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import machine, write_section
from _servers import LLAMA_SERVER, free_port, launched, llama_server, parrot_command

from parrot.engines.protocol.grammar import offline_registry

SUBSETS = (
    "Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra",
    "Glaiveai2K", "Kubernetes", "Snowplow", "JsonSchemaStore", "WashingtonPost",
)  # fmt: skip
PROMPT = (
    "Write one JSON value that follows this JSON schema, with realistic values, and nothing "
    "else.\n\nSchema:\n{schema}"
)
SCHEMA_PROMPT_CHARS = 6_000  # a longer schema is cut in the prompt (the format still holds all of it)


def schemas(data: Path, subset: str) -> list[tuple[str, dict]]:
    out = []
    for path in sorted((data / subset).glob("*.json")):
        try:
            out.append((path.stem, json.loads(path.read_text())))
        except (ValueError, UnicodeDecodeError):
            continue
    return out


# -- coverage ------------------------------------------------------------------------------


def _check(schema: dict) -> str | None:
    """None when Parrot accepts ``schema`` as a response format, else the reason's first line
    (the checks of the front and the engine, in a worker process)."""
    import msgspec

    from parrot.engines.protocol import grammar
    from parrot.engines.protocol.errors import ParrotError
    from parrot.engines.protocol.openai_requests import sampling_params
    from parrot.wire.openai_schemas import ChatCompletionRequest

    body = {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    try:
        request = msgspec.convert(body, ChatCompletionRequest)
        fmt = sampling_params(request, 16).format
        grammar.check_format(fmt)
        grammar.probe(fmt)
        grammar.check_grammar(fmt, grammar.to_grammar(fmt), _engine_tokenizer())
    except ParrotError as error:
        return str(error).splitlines()[0]
    except msgspec.ValidationError as error:
        return f"request body: {error}"
    return None


_TOKENIZER = None


def _engine_tokenizer():
    """The bundled model's vocabulary as llguidance sees it, once per worker."""
    global _TOKENIZER
    if _TOKENIZER is None:
        import llguidance.hf
        import transformers

        from parrot.engines.builtin.model.loader import default_cache_dir, resolve_model_folder

        folder = resolve_model_folder(None, default_cache_dir())
        _TOKENIZER = llguidance.hf.from_tokenizer(transformers.AutoTokenizer.from_pretrained(str(folder)))
    return _TOKENIZER


def _reason_key(reason: str) -> str:
    """The reason without its schema-specific parts (for counting)."""
    for marker in (" (after the text", ' at "', " at /"):
        reason = reason.split(marker)[0]
    return reason[:120]


def coverage(data: Path, timeout_s: float) -> str:
    rows, reasons = [], collections.Counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        for subset in SUBSETS:
            items = schemas(data, subset)
            futures = [(name, pool.submit(_check, schema)) for name, schema in items]
            refused = timed_out = 0
            for _, future in futures:
                try:
                    reason = future.result(timeout=timeout_s)
                except FutureTimeout:
                    reason, timed_out = f"over {timeout_s:g} s to check", timed_out + 1
                if reason is not None:
                    refused += 1
                    reasons[(subset, _reason_key(reason))] += 1
            accepted = len(items) - refused
            share = accepted / max(1, len(items))
            rows.append(f"| {subset} | {len(items)} | {accepted} ({share:.2f}) | {refused} |")
            print(rows[-1], flush=True)
    top = collections.Counter()
    for (_, reason), n in reasons.items():
        top[reason] += n
    lines = [
        f"Machine: {machine()}. Every schema of each subset, checked as `response_format` "
        "(no generation).",
        "",
        "| subset | schemas | accepted | refused |",
        "| --- | ---: | ---: | ---: |",
        *rows,
        "",
        "The reasons of the refusals, most frequent first:",
        "",
        "| reason | schemas |",
        "| --- | ---: |",
        *[f"| {reason.replace('|', '/')} | {n} |" for reason, n in top.most_common(15)],
    ]
    return "\n".join(lines)


# -- generate ------------------------------------------------------------------------------


def verdict(schema: dict, status: int, body: dict | str, seconds: float) -> dict:
    if status >= 500 or status == 0:
        return {"outcome": "failed", "why": str(body)[:200], "s": seconds}
    if status >= 400:
        message = body.get("error", {}).get("message", "") if isinstance(body, dict) else str(body)
        return {"outcome": "refused", "why": message[:200], "s": seconds}
    choice = body["choices"][0]
    text = choice["message"].get("content") or ""
    if choice.get("finish_reason") == "length":
        return {"outcome": "cut", "s": seconds}
    try:
        value = json.loads(text)
    except ValueError:
        return {"outcome": "not json", "why": text[:120], "s": seconds}
    try:
        checker = jsonschema_rs.validator_for(schema, validate_formats=True, registry=offline_registry())
    except (ValueError, jsonschema_rs.ValidationError) as error:  # it cannot read the schema
        return {"outcome": "unjudged", "why": str(error)[:160], "s": seconds}
    problem = next(checker.iter_errors(value), None)
    if problem is not None:
        return {"outcome": "schema-invalid", "why": problem.message[:160], "s": seconds}
    return {"outcome": "valid", "s": seconds}


async def ask_all(url: str, model: str | None, sample: list[tuple[str, str, dict]], args) -> list[dict]:
    gate = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency + 2)

    async def one(client: httpx.AsyncClient, schema: dict) -> dict:
        text = json.dumps(schema, separators=(",", ":"))[:SCHEMA_PROMPT_CHARS]
        body = {
            "messages": [{"role": "user", "content": PROMPT.format(schema=text)}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        if model:
            body["model"] = model
        async with gate:
            start = time.perf_counter()
            try:
                answer = await client.post("/v1/chat/completions", json=body)
            except httpx.HTTPError as error:
                return verdict(schema, 0, repr(error), time.perf_counter() - start)
            seconds = time.perf_counter() - start
            try:
                payload = answer.json()
            except ValueError:
                payload = answer.text
            return verdict(schema, answer.status_code, payload, seconds)

    async with httpx.AsyncClient(base_url=url, timeout=args.timeout_s, limits=limits) as client:
        return await asyncio.gather(*(one(client, schema) for _, _, schema in sample))


def parrot_serve(gguf: str | None):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = parrot_command("serve", "--port", str(port), "--engine-port", str(free_port()), "--no-dashboard")
    if gguf:
        cmd += ["--model", gguf]

    def ready() -> bool:
        return httpx.get(f"{url}/healthz", timeout=2).json()["status"] == "ok"

    return launched(cmd, ready, "parrot serve", timeout_s=900, stop=signal.SIGINT), url


def summarize(subset_rows: dict[str, list[dict]]) -> tuple[list[str], collections.Counter]:
    rows, why = [], collections.Counter()
    for subset, results in subset_rows.items():
        count = collections.Counter(r["outcome"] for r in results)
        seconds = statistics.median(r["s"] for r in results) if results else 0.0
        judged = len(results) - count["unjudged"]
        rows.append(
            f"{subset} | {count['valid']}/{judged} ({count['valid'] / max(1, judged):.2f}) | "
            f"{count['cut']} | {count['refused']} | {count['schema-invalid'] + count['not json']} | "
            f"{count['failed']} | {seconds:.1f}"
        )
        for r in results:
            if r["outcome"] in ("refused", "schema-invalid", "not json", "failed"):
                why[f"{r['outcome']}: {_reason_key(r.get('why', ''))}"] += 1
    return rows, why


def generate(data: Path, args) -> str:
    from parrot.engines.builtin.model.loader import default_model_path

    gguf = args.gguf or str(default_model_path())
    rng = random.Random(args.seed)
    sample = []
    for subset in SUBSETS:
        items = schemas(data, subset)
        drawn = rng.sample(items, min(args.per_subset, len(items)))
        sample += [(subset, name, schema) for name, schema in drawn]
    sides: dict[str, dict[str, list[dict]]] = {}
    for side in args.sides:
        started = time.perf_counter()
        if side == "parrot":
            server, url = parrot_serve(args.gguf)
            with server:
                results = asyncio.run(ask_all(url, None, sample, args))
        else:
            with llama_server(gguf, args.threads, slots=args.concurrency, slot_ctx=4096) as url:
                results = asyncio.run(ask_all(url, None, sample, args))
        by_subset: dict[str, list[dict]] = collections.defaultdict(list)
        for (subset, _, _), result in zip(sample, results, strict=True):
            by_subset[subset].append(result)
        sides[side] = by_subset
        print(f"{side}: {time.perf_counter() - started:.0f} s", flush=True)
    lines = [
        f"Machine: {machine()}. {args.per_subset} schemas a subset (seed {args.seed}), "
        f"{Path(args.gguf).name if args.gguf else 'the bundled GGUF'} on both sides, "
        f"`max_tokens` {args.max_tokens}, greedy, {args.concurrency} at a time. "
        "valid: schema-valid with format checks, of those `jsonschema_rs` can judge; cut: "
        "`finish_reason` length; broke: not JSON, or JSON that breaks its schema; failed: 5xx or "
        "no answer; s: median seconds a schema.",
        "",
        "| subset | " + " | ".join(f"{s}: valid | cut | refused | broke | failed | s" for s in sides) + " |",
        "| --- | " + " | ".join("---: | ---: | ---: | ---: | ---: | ---:" for _ in sides) + " |",
    ]
    summaries = {side: summarize(rows) for side, rows in sides.items()}
    for i, subset in enumerate(SUBSETS):
        cells = [summaries[side][0][i].split(" | ", 1)[1] for side in sides]
        lines.append(f"| {subset} | " + " | ".join(cells) + " |")
    totals = []
    for side, rows in sides.items():
        every = [r for results in rows.values() for r in results]
        judged = [r for r in every if r["outcome"] != "unjudged"]
        valid = sum(r["outcome"] == "valid" for r in judged)
        totals.append(f"{side} {valid}/{len(judged)} ({valid / max(1, len(judged)):.2f})")
    lines += ["", "All subsets: " + "; ".join(totals) + "."]
    for side, (_, why) in summaries.items():
        if why:
            lines += ["", f"{side}, what went wrong:", ""]
            lines += [f"- {reason} ({n})" for reason, n in why.most_common(10)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measure", choices=["coverage", "generate"])
    parser.add_argument("--data", type=Path, required=True, help="the data folder of jsonschemabench")
    parser.add_argument("--timeout-s", type=float, default=600, help="a request's (a check's) limit")
    parser.add_argument("--per-subset", type=int, default=4)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads")
    parser.add_argument("--gguf", default=None, help="both sides' model (default: the bundled GGUF)")
    both = ["parrot", "llama-server"]
    parser.add_argument("--sides", nargs="+", default=both, choices=both)
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--label", default=None, help="a docs section of its own (schemabench-MEASURE-LABEL)")
    args = parser.parse_args()
    if args.measure == "generate" and "llama-server" in args.sides and not LLAMA_SERVER.exists():
        raise SystemExit(f"{LLAMA_SERVER} is missing: `make bench-peers` builds it (or --sides parrot)")
    table = coverage(args.data, args.timeout_s) if args.measure == "coverage" else generate(args.data, args)
    print(table)
    if not args.no_write:
        write_section(f"schemabench-{args.measure}" + (f"-{args.label}" if args.label else ""), table)


if __name__ == "__main__":
    main()
