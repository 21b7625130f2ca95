"""``parrot serve``: the ServeCore on 127.0.0.1:9000, with a builtin engine process by default."""

from __future__ import annotations

import argparse
import secrets
import signal
import socket
import subprocess
import sys
import threading

from parrot.cli.settings import ServeSettings, add_serve_arguments


def add_parser(commands) -> None:
    p: argparse.ArgumentParser = commands.add_parser("serve", help="run the ServeCore (Parrot API)")
    add_serve_arguments(p)
    p.set_defaults(run=run)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a process holds ``port``. SO_REUSEADDR, as every server sets it (uvicorn
    too): without it, the TIME_WAIT sockets that a stopped engine leaves for about a minute
    count as "in use" and a restart fails; with it, only a socket really bound there does."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _die_with_parent() -> None:
    """In the child, before exec: Linux sends it SIGTERM when ``parrot serve`` dies, even by
    SIGKILL, so an engine is never left running (and holding its port) without its server."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_engine(settings: ServeSettings) -> tuple[subprocess.Popen, str]:
    """A ``parrot engine`` child process, started: it binds its port at once and loads its
    model meanwhile; the ServeCore registers it once loaded (its ``/healthz`` says the stage)."""
    if port_in_use(settings.engine_port):  # else another engine there would answer our pings
        raise SystemExit(
            f"parrot serve: port {settings.engine_port} for the builtin engine is in use "
            "(another engine? pass --engine URL to use it, or --engine-port)"
        )
    cmd = [
        sys.executable,
        "-m",
        "parrot.cli.main",
        "engine",
        "--host",
        "127.0.0.1",
        "--port",
        str(settings.engine_port),
    ]
    if settings.model:
        cmd += ["--model", settings.model]
    proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    return proc, f"http://127.0.0.1:{settings.engine_port}"


def watch_engine(proc: subprocess.Popen, stopping: threading.Event, died: threading.Event) -> None:
    """Set ``died`` (the server stops on it) when the builtin engine fails (a model that does
    not load, a crash) unless the server is ``stopping``: a ServeCore left without the
    engine it was started for serves nothing. (Exit code 0: it was stopped, as by the
    Ctrl-C that the terminal sends both processes; the server stops on its own.)"""

    def wait() -> None:
        code = proc.wait()
        if code != 0 and not stopping.is_set():
            print(f"parrot serve: the builtin engine exited with code {code}; stopping", flush=True)
            died.set()

    threading.Thread(target=wait, name="parrot-engine-watch", daemon=True).start()


def run(args: argparse.Namespace) -> None:
    from parrot.engines.protocol import server
    from parrot.engines.protocol.urls import public_url
    from parrot.platform.serve.core import ServeCore
    from parrot.platform.store.secret_box import SecretBox
    from parrot.platform.store.store import Store, sqlite_url
    from parrot.web.app import create_server_app
    from parrot.web.config import DashboardConfig

    settings = ServeSettings.from_args(args)
    if port_in_use(settings.port, settings.host):  # before a token or an engine is made for nothing
        raise SystemExit(
            f"parrot serve: port {settings.port} for the Parrot API is in use on {settings.host}; "
            "stop what holds it, or pick another port (--port, PARROT_PORT; make run PORT=...)"
        )
    token = settings.admin_token
    if not token:
        token = secrets.token_urlsafe(24)
        print(
            f"parrot serve: admin token (shown once, not stored; set a fixed one with --admin-token "
            f"or PARROT_ADMIN_TOKEN): {token}",
            flush=True,
        )
    # SIGTERM stops the server as SIGINT does (uvicorn handles both while it runs; this
    # covers the start), so the engine child is always stopped below.
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    child = own = None
    stopping, engine_died = threading.Event(), threading.Event()
    urls = settings.engine_urls
    if not urls and settings.start_engine:
        child, own = start_engine(settings)
        watch_engine(child, stopping, engine_died)
        urls = (own,)
    host, port = settings.host, settings.port
    try:
        # Engine secrets at rest: PARROT_SECRET_KEY, else a key file in the data folder.
        box = SecretBox.load(settings.secret_keys, settings.data_dir)
        store = Store(settings.db or sqlite_url(settings.data_dir), secrets=box)
        core = ServeCore(
            settings.session_timeout_s,
            store,
            settings.policy,
            settings.pressure,
            settings.health,
            limits=settings.limits,
            transform_limits=settings.transforms,
            engine_settings=settings.engine,
        )
        dashboard = DashboardConfig(
            enabled=settings.dashboard,
            require_sign_in=settings.dashboard_auth,
            secure_cookies=settings.secure_cookies,
        )
        app = create_server_app(
            core,
            engine_urls=urls,
            admin_token=token,
            openai_api_keys=settings.openai_api_keys,
            dashboard=dashboard,
            own_engine=own,
        )
        # Open live streams (the dashboard's SSE) must not hold a shutdown up.
        ready = (
            f"parrot serve: Parrot API on http://{host}:{port} with engines {[public_url(u) for u in urls]}"
            + (f"; dashboard on http://{host}:{port}/" if settings.dashboard else "")
            + ("\nparrot serve: the builtin engine is loading its model: /healthz answers 503 'loading' "
               "with the stage, then 'ok'" if own else "")
        )  # fmt: skip
        server.run(
            app, host, port, settings.server, ready_message=ready, stop=engine_died,
            log_level="warning", timeout_graceful_shutdown=5,
        )  # fmt: skip
    finally:
        stopping.set()
        if child is not None and child.poll() is None:
            print("parrot serve: the API stopped; stopping its builtin engine (up to 30 s)", flush=True)
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        print("parrot serve: stopped", flush=True)
    if engine_died.is_set():
        raise SystemExit(1)
