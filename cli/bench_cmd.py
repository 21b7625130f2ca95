"""``parrot bench WORKLOAD``: the application benchmark suite of a source checkout
(``benchmarks/apps/``), which starts its own engines and ServeCores."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]  # cli/bench_cmd.py -> the repository


def _suite_cli():
    """``benchmarks.apps.cli`` of the checkout this command is installed from, or None."""
    if not (CHECKOUT / "benchmarks" / "apps" / "cli.py").is_file():
        return None
    if str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
    from benchmarks.apps import cli

    return cli


def add_parser(commands) -> None:
    p: argparse.ArgumentParser = commands.add_parser(
        "bench", help="run the application benchmarks (Parrot vs a request-level baseline)"
    )
    cli = _suite_cli()
    if cli is None:
        p.set_defaults(run=_missing)
        return
    cli.add_arguments(p)
    p.set_defaults(run=cli.run)


def _missing(args: argparse.Namespace) -> None:
    raise SystemExit(
        "parrot bench: needs a source checkout (benchmarks/apps/); install it with pip install -e"
    )
