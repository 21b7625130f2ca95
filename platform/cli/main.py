"""The ``parrot`` command: ``parrot serve`` runs the ServeCore, ``parrot engine`` one engine,
``parrot run APP.py`` a Parrot application against a server, ``parrot bench`` the
application benchmarks."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from parrot.platform.cli import bench_cmd, engine_cmd, serve_cmd
from parrot.sdk import run as run_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="parrot", description="Parrot: serving LLM-based applications")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    commands = parser.add_subparsers(dest="command", required=True)
    engine_cmd.add_parser(commands)
    serve_cmd.add_parser(commands)
    run_cmd.add_parser(commands)
    bench_cmd.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "httpx2"):  # one line per engine request (and ping) is noise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        args.run(args)
    except KeyboardInterrupt:
        pass
    except ValueError as error:  # bad configuration
        sys.exit(f"parrot: {error}")


if __name__ == "__main__":
    main()
