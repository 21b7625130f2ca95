"""The ``parrot`` console script, on either install of the distribution.

``pip install parrot-serve`` is the client alone (the SDK, the LangChain adapter, the wire
contract); the server commands (``serve``, ``engine``, ``bench``) need the packages of the
``[server]`` extra. Without them, a server command says what to install instead of ending
in an ImportError traceback, and ``parrot run`` (the SDK's, :mod:`parrot.sdk.run`) still
works. This module imports only the standard library and the SDK until it knows which.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from parrot.sdk import run as run_cmd

SERVER_COMMANDS = ("serve", "engine", "bench")
SERVER_EXTRA = "pip install 'parrot-serve[server]'"


def main(argv: Sequence[str] | None = None) -> None:
    try:
        from parrot.cli.main import main as server_main
    except ModuleNotFoundError as error:
        if (error.name or "parrot").split(".")[0] == "parrot":
            raise  # a module of Parrot itself is missing: a bug, not a missing extra
        client_main(argv, missing=error.name)
    else:
        server_main(argv)


def client_main(argv: Sequence[str] | None, missing: str | None) -> None:
    """The command line of a client-only install: ``parrot run``; the server commands exit
    with the install command (logging options are taken and ignored, so the same command
    lines parse on both installs)."""
    parser = argparse.ArgumentParser(
        prog="parrot",
        description="Parrot (client install: the server commands need the [server] extra)",
    )
    parser.add_argument("--log-level", help=argparse.SUPPRESS)
    parser.add_argument("--log-json", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd.add_parser(commands)
    for name in SERVER_COMMANDS:
        commands.add_parser(name, help=f"(needs {SERVER_EXTRA})", add_help=False)
    args, _ = parser.parse_known_args(argv)  # a server command's own options are not known here
    if args.command in SERVER_COMMANDS:
        sys.exit(
            f"parrot {args.command}: this install of Parrot is the client only (the Python module "
            f"{missing!r} is missing). The server commands ({', '.join(SERVER_COMMANDS)}) need the "
            f"server's packages: {SERVER_EXTRA} (on a GPU host, install a CUDA build of torch "
            "first; see docs/deployment.md)."
        )
    args = parser.parse_args(argv)  # `parrot run`: strictly, as the server's command line would
    args.run(args)


if __name__ == "__main__":
    main()
