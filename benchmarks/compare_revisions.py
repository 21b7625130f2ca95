"""Two checkouts of Parrot on the same workload, in turn: does a change regress speed?

    python benchmarks/compare_revisions.py BEFORE_PARROT AFTER_PARROT [--workloads single-call,chain]
        [--rounds 3]

``BEFORE_PARROT`` and ``AFTER_PARROT`` are the ``parrot`` scripts of two installs (e.g. a git
worktree of the old commit with its own venv, and this checkout's ``.venv/bin/parrot``).
Each round runs ``parrot bench WORKLOAD --quick --runs 1 --no-docs`` once per side, the sides
alternating (A B, B A, ...) so drift of a noisy machine falls on both; each run starts its
own engine and ServeCore. The figure compared is Parrot's own time (``parrot: s per call``,
``parrot: app s``), its median over the rounds with the spread (min-max), and the ratio
after/before of the medians. A ratio inside the two spreads is "within noise".
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys

# A run's Parrot line: "| parrot: s per call 1.1 |", "| parrot: app s 8.8, first token s 8.2 |":
# the first figure of it (a call's or an application's time).
FIGURE = re.compile(r"\| parrot: [a-z ]+? ([0-9.]+)[,| ]")


def run_once(parrot: str, workload: str) -> float:
    out = subprocess.run(
        [parrot, "bench", workload, "--quick", "--runs", "1", "--no-docs"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=True,
    ).stdout  # fmt: skip  (the per-run lines go to stderr)
    found = [float(x) for x in FIGURE.findall(out)]
    if not found:
        raise SystemExit(f"no 'parrot:' time in the output of {parrot} bench {workload}")
    return statistics.fmean(found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--workloads", default="single-call,chain")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for workload in args.workloads.split(","):
        times: dict[str, list[float]] = {"before": [], "after": []}
        for n in range(args.rounds):
            order = ("before", "after") if n % 2 == 0 else ("after", "before")
            for side in order:
                t = run_once(getattr(args, side), workload)
                times[side].append(t)
                print(f"{workload} round {n} {side}: {t:.3f} s", file=sys.stderr, flush=True)
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        overlap = min(times["after"]) <= max(times["before"]) and min(times["before"]) <= max(times["after"])
        rows.append(
            f"| {workload} | {b:.2f} ({min(times['before']):.2f}-{max(times['before']):.2f}) "
            f"| {a:.2f} ({min(times['after']):.2f}-{max(times['after']):.2f}) | {a / b:.2f} "
            f"| {'yes' if overlap else 'no'} |"
        )
    print("| workload (quick) | before: s, median (min-max) | after | after / before | overlap |")
    print("| --- | ---: | ---: | ---: | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
