"""The HTTP server's limits as flags of ``parrot serve`` and ``parrot engine`` (the same
``PARROT_*`` variables for both, so a builtin engine started by ``parrot serve`` gets them):

=========================  =========================  ==========================================
flag                       variable                   default: meaning
=========================  =========================  ==========================================
``--header-timeout``       PARROT_HEADER_TIMEOUT      10 s for a request head, from its first byte
``--body-timeout``         PARROT_BODY_TIMEOUT        60 s for a request body, after its head
``--keep-alive-timeout``   PARROT_KEEP_ALIVE_TIMEOUT  5 s an idle connection stays open
``--max-connections``      PARROT_MAX_CONNECTIONS     2048 open connections (below the fd limit)
=========================  =========================  ==========================================
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from parrot.engines.protocol.server import ServerLimits


def add_server_arguments(p: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    # Imported here: the settings module adds these flags to ``parrot serve`` (a cycle).
    from parrot.cli.settings import from_env

    d = ServerLimits()
    group = p.add_argument_group("HTTP server limits (slow or too many clients)")
    group.add_argument(
        "--header-timeout",
        type=float,
        default=from_env("HEADER_TIMEOUT", float, d.header_timeout_s, env),
        help="seconds a request head may take, from its first byte; later: 408, closed (10)",
    )
    group.add_argument(
        "--body-timeout",
        type=float,
        default=from_env("BODY_TIMEOUT", float, d.body_timeout_s, env),
        help="seconds a request body may take after its head (60)",
    )
    group.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=from_env("KEEP_ALIVE_TIMEOUT", float, d.keep_alive_s, env),
        help="seconds an idle connection stays open between requests (5)",
    )
    group.add_argument(
        "--max-connections",
        type=int,
        default=from_env("MAX_CONNECTIONS", int, d.max_connections, env),
        help="open connections at most; at the cap the one waiting longest for a request head "
        "is closed, or the new one refused (503) when all are busy (2048)",
    )


def server_limits_from_args(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keep_alive_s=args.keep_alive_timeout,
        max_connections=args.max_connections,
        max_body_bytes=getattr(args, "max_body_bytes", None),  # both commands have the flag
    )
