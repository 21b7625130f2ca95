"""Running applications: ``parrot run APP.py --server URL [ARGS ...]`` and the command line
of an application script.

``parrot run`` runs APP.py as ``__main__`` (as ``python APP.py ARGS`` would) with
``$PARROT_SERVER`` set to URL, so every :class:`Client` it makes without a ``base_url``
talks to that server. An application written with :func:`app_main` also takes
``--server`` itself.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from parrot.sdk.config import DEFAULT_SERVER


def add_parser(commands: Any) -> None:
    """Add ``run`` to the ``parrot`` command's subparsers."""
    parser = commands.add_parser("run", help="run a Parrot application script against a server")
    _add_arguments(parser)
    parser.set_defaults(run=run)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", help="the application: a Python file")
    parser.add_argument("--server", default=None, help="Parrot server URL (default: $PARROT_SERVER)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the application")


def _split(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """``--server`` may also come after APP (argparse leaves it among the app's arguments);
    everything after a ``--`` is the app's, as it is."""
    rest = list(args.args)
    after = rest.index("--") if "--" in rest else len(rest)
    ours = argparse.ArgumentParser(add_help=False)
    ours.add_argument("--server", default=args.server)
    known, unknown = ours.parse_known_args(rest[:after])
    return known.server, unknown + rest[after + 1 :]


def run(args: argparse.Namespace) -> None:
    """Run ``args.app`` as ``__main__`` with the arguments ``parrot run`` does not take."""
    app = Path(args.app)
    if not app.is_file():
        raise SystemExit(f"parrot run: no such file: {app}")
    server, app_args = _split(args)
    if server:
        os.environ["PARROT_SERVER"] = server
    sys.argv = [str(app), *app_args]
    sys.path.insert(0, str(app.resolve().parent))
    runpy.run_path(str(app), run_name="__main__")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m parrot.sdk.run APP.py --server URL [ARGS ...]``."""
    parser = argparse.ArgumentParser(prog="parrot run", description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    run(parser.parse_args(argv))


def app_main(func: Callable[[str], Any], argv: Sequence[str] | None = None) -> None:
    """The command line of an application: ``python APP.py [--server URL]`` calls
    ``func(server_url)`` and prints what it returns as JSON."""
    parser = argparse.ArgumentParser(
        description=inspect.getdoc(inspect.getmodule(func)),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--server",
        default=os.environ.get("PARROT_SERVER", DEFAULT_SERVER),
        help="Parrot server URL (default: $PARROT_SERVER, else %(default)s)",
    )
    result = func(parser.parse_args(argv).server)
    print(json.dumps(result, indent=2, ensure_ascii=False, default=str))


if __name__ == "__main__":
    main()
