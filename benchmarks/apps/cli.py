"""The command line of the suite: ``parrot bench WORKLOAD`` and ``python -m benchmarks.apps``.

Only argparse at import time: ``parrot`` builds this parser on every start.
"""

from __future__ import annotations

import argparse
import importlib
import re
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

WORKLOADS = {  # name: module in benchmarks.apps
    "chain": "chain",
    "map-reduce": "map_reduce",
    "chatbot": "chatbot",
    "agents": "agents",
    "mixed": "mixed",
    "single-call": "single_call",
}


def _integers(text: str, example: str, least: int) -> tuple[int, ...]:
    """Comma-separated integers, each at least ``least``."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {example}, got {text!r}") from None
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"give at least one value, each at least {least}")
    return values


def _milliseconds(text: str) -> tuple[int, ...]:
    return _integers(text, "milliseconds like 0,50,200", 0)


def _counts(text: str) -> tuple[int, ...]:
    return _integers(text, "counts like 1,2,3", 1)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _label(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", text):
        raise argparse.ArgumentTypeError(f"a label is lower-case letters, digits and -, got {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", choices=[*WORKLOADS, "all"], help="the workload to run, or all of them")
    parser.add_argument(
        "--rtt-ms",
        type=_milliseconds,
        default=None,
        help="simulated client-server round trips per request, comma-separated (default 0,50,200; quick: 0)",
    )
    parser.add_argument(
        "--runs",
        type=_positive,
        default=None,
        help="runs per measurement, sides alternating (default 3: a median and a spread)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes per workload")
    parser.add_argument(
        "--ablations", action="store_true", help="also Parrot with each scheduling policy off"
    )
    parser.add_argument(
        "--front", action="store_true", help="a third side: the request-level client on Parrot's OpenAI front"
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="use this running parrot engine (repeatable) instead of starting engines",
    )
    parser.add_argument("--kv-cache-memory", default="2GiB", help="KV cache of each engine started")
    parser.add_argument(
        "--engine-capacity",
        type=_positive,
        default=None,
        metavar="N",
        help="register the engines on the ServeCores with N tasks at once (default: parrot serve's)",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every engine started (repeatable; --engine-arg=--latency-max-batch=4)",
    )
    parser.add_argument(
        "--fleet",
        type=_counts,
        default=(),
        metavar="N,M",
        help="run on N (then M, ...) llama.cpp replicas (`make bench-peers`) instead of parrot engines, "
        "against request-level clients round-robin and least-busy on the same replicas",
    )
    parser.add_argument("--fleet-slots", type=_positive, default=4, help="parallel slots of each replica")
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the servers' logs in DIR at debug level (the engines trace every step)",
    )
    parser.add_argument(
        "--label",
        type=_label,
        default=None,
        help="docs sections of their own for this run, named with LABEL (e.g. cuda for a GPU host)",
    )
    parser.add_argument(
        "--docs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write tables and plots into docs/ (default: yes, except with --quick)",
    )


def run(args: argparse.Namespace) -> None:
    from benchmarks.apps.report import report, summary
    from benchmarks.apps.suite import Options, run_workload

    options = Options(
        size="quick" if args.quick else "full",
        rtts_ms=args.rtt_ms or ((0,) if args.quick else (0, 50, 200)),
        runs=args.runs or 3,  # one run's ratio is noise on a shared machine (issue 24)
        ablations=args.ablations,
        front=args.front,
        engine_urls=tuple(args.engine),
        kv_cache=args.kv_cache_memory,
        capacity=args.engine_capacity,
        engine_args=tuple(args.engine_arg),
        logs=args.logs,
        label=args.label or "",
        fleet=args.fleet,
        fleet_slots=args.fleet_slots,
    )
    write = not args.quick if args.docs is None else args.docs
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    everything, failed = [], []
    for name in names:
        workload = importlib.import_module(f"benchmarks.apps.{WORKLOADS[name]}").WORKLOAD
        start = time.monotonic()
        try:
            results = run_workload(workload, options)
        except Exception:  # one workload's failure does not lose the others' results
            traceback.print_exc()
            failed.append(name)
            continue
        print(report(results, write), flush=True)
        print(f"\n({name}: {time.monotonic() - start:.0f} s)\n", flush=True)
        everything.append(results)
    if len(everything) > 1:
        print(summary(everything, write), flush=True)
    if failed:
        raise SystemExit(f"parrot bench: failed: {', '.join(failed)}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.apps", description=__doc__.split("\n")[0])
    add_arguments(parser)
    run(parser.parse_args(argv))
