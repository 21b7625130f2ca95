"""``parrot serve``: the ServeCore on 127.0.0.1:9000, with a builtin engine process by default."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def add_parser(commands) -> None:
    p: argparse.ArgumentParser = commands.add_parser("serve", help="run the ServeCore (Parrot API)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="register a running engine (repeatable); without it a builtin engine is started",
    )
    p.add_argument(
        "--no-engine",
        action="store_true",
        help="start no builtin engine (register engines later with POST /v1/engines)",
    )
    p.add_argument("--engine-port", type=int, default=9001, help="port of the builtin engine it starts")
    p.add_argument("--model", default=None, help="model of the builtin engine it starts")
    p.add_argument("--admin-token", default=None, help="default: $PARROT_ADMIN_TOKEN, else generated")
    p.add_argument(
        "--session-timeout", type=float, default=3600.0, help="seconds before an idle session expires"
    )
    for name, what in (
        ("app-fifo", "downstream tasks of applications in progress first"),
        ("task-groups", "schedule the tasks one consumer waits on together"),
        ("context-affinity", "prefer the engine holding the longest prompt prefix"),
        ("criteria", "latency-critical tasks first and to lightly loaded engines"),
    ):
        p.add_argument(f"--no-{name}", action="store_true", help=f"scheduling policy off: {what}")
    p.add_argument(
        "--openai-api-key",
        action="append",
        default=[k for k in os.environ.get("PARROT_OPENAI_API_KEYS", "").split(",") if k],
        metavar="KEY",
        help="require this key on the OpenAI-compatible /v1 routes (repeatable; "
        "default: $PARROT_OPENAI_API_KEYS, comma-separated; none: open)",
    )
    p.add_argument(
        "--dashboard-auth",
        action="store_true",
        default=os.environ.get("PARROT_DASHBOARD_AUTH", "") not in ("", "0"),
        help="the dashboard's read-only pages need signing in too (default: open to loopback "
        "clients; $PARROT_DASHBOARD_AUTH=1)",
    )
    p.add_argument("--no-dashboard", action="store_true", help="serve the API only, no dashboard pages")
    p.add_argument(
        "--db",
        default=os.environ.get("PARROT_DB"),
        metavar="URL",
        help="SQLAlchemy URL of the database (default: $PARROT_DB, else SQLite in the data folder)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="data folder (default: $PARROT_DATA_DIR, else $XDG_DATA_HOME/parrot or ~/.local/share/parrot)",
    )
    p.set_defaults(run=run)


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """In the child, before exec: Linux sends it SIGTERM when ``parrot serve`` dies, even by
    SIGKILL, so an engine is never left running (and holding its port) without its server."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_engine(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """A ``parrot engine`` child process; returns it once it answers ``/ping``."""
    if _port_in_use(args.engine_port):  # else another engine there would answer our pings
        raise SystemExit(
            f"parrot serve: port {args.engine_port} for the builtin engine is in use "
            "(another engine? pass --engine URL to use it, or --engine-port)"
        )
    cmd = [
        sys.executable,
        "-m",
        "parrot.platform.cli.main",
        "engine",
        "--host",
        "127.0.0.1",
        "--port",
        str(args.engine_port),
    ]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    url = f"http://127.0.0.1:{args.engine_port}"
    deadline = time.monotonic() + 600  # the first start converts the model
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"parrot serve: the builtin engine exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/ping", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.terminate()
            raise SystemExit("parrot serve: the builtin engine did not start in time")
        time.sleep(0.5)


def data_dir(flag: str | None) -> Path:
    if flag:
        return Path(flag)
    if os.environ.get("PARROT_DATA_DIR"):
        return Path(os.environ["PARROT_DATA_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "parrot"


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from parrot.platform.api.app import create_app
    from parrot.platform.serve.core import ServeCore
    from parrot.platform.serve.scheduler.policy import SchedulingPolicy
    from parrot.platform.store.store import Store, sqlite_url
    from parrot.web.config import DashboardConfig

    token = args.admin_token or os.environ.get("PARROT_ADMIN_TOKEN")
    if not token:
        token = secrets.token_urlsafe(24)
        print(f"parrot serve: admin token (shown once): {token}", flush=True)
    # SIGTERM stops the server as SIGINT does (uvicorn handles both while it runs; this
    # covers the start), so the engine child is always stopped below.
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    child = None
    urls = tuple(args.engine)
    if not urls and not args.no_engine:
        child, url = start_engine(args)
        urls = (url,)
    try:
        print(
            f"parrot serve: Parrot API on http://{args.host}:{args.port} with engines {list(urls)}"
            + ("" if args.no_dashboard else f"; dashboard on http://{args.host}:{args.port}/"),
            flush=True,
        )
        store = Store(args.db or sqlite_url(data_dir(args.data_dir)))
        policy = SchedulingPolicy(
            app_fifo=not args.no_app_fifo,
            task_groups=not args.no_task_groups,
            context_affinity=not args.no_context_affinity,
            criteria=not args.no_criteria,
        )
        core = ServeCore(args.session_timeout, store, policy)
        keys = tuple(args.openai_api_key)
        dashboard = DashboardConfig(enabled=not args.no_dashboard, require_sign_in=args.dashboard_auth)
        app = create_app(core, engine_urls=urls, admin_token=token, openai_api_keys=keys, dashboard=dashboard)
        # Open live streams (the dashboard's SSE) must not hold a shutdown up.
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
    finally:
        if child is not None:
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
