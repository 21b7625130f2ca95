"""The ``parrot`` command: ``parrot serve`` runs the ServeCore, ``parrot engine`` one engine,
``parrot run APP.py`` a Parrot application against a server, ``parrot bench`` the
application benchmarks."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from parrot.cli import bench_cmd, engine_cmd, serve_cmd
from parrot.cli.logs import LEVELS, configure_logging
from parrot.cli.settings import from_env
from parrot.sdk import run as run_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parrot", description="Parrot: serving LLM-based applications")
    parser.add_argument(
        "--log-level",
        default=from_env("LOG_LEVEL", str.lower, "info"),
        choices=LEVELS,
        help="debug: a line per call; info: a line per HTTP request and a summary per minute "
        "(default: $PARROT_LOG_LEVEL, else info)",
    )
    parser.add_argument(
        "--log-json",
        action="store_true",
        default=from_env("LOG_JSON", lambda raw: raw.lower() not in ("0", "false", "no", "off"), False),
        help="log JSON lines (default: $PARROT_LOG_JSON)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    engine_cmd.add_parser(commands)
    serve_cmd.add_parser(commands)
    run_cmd.add_parser(commands)
    bench_cmd.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    try:
        args = build_parser().parse_args(argv)  # a bad PARROT_* value raises ValueError
        configure_logging(args.log_level, args.log_json)
        args.run(args)
    except KeyboardInterrupt:
        pass
    except ValueError as error:  # bad configuration
        sys.exit(f"parrot: {error}")


if __name__ == "__main__":
    main()
