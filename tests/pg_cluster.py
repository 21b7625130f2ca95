"""A throwaway PostgreSQL cluster for the PostgreSQL tier of the tests: Debian's server
binaries, ``initdb`` into a temporary folder, ``postgres`` on a loopback port, stopped and
deleted at the end. PostgreSQL refuses to run as root: as root, the cluster belongs to the
``postgres`` user (``runuser``)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

USER = "parrot"
INSTALL_HINT = (
    "the PostgreSQL tier needs Debian's PostgreSQL server (initdb, postgres): `make test` installs it "
    "(apt-get install -y postgresql), or install it yourself"
)


def server_bin_dir() -> Path:
    """The folder of the newest installed PostgreSQL server's binaries."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and shutil.which("postgres"):
        return Path(initdb).resolve().parent
    raise RuntimeError(INSTALL_HINT)


class PostgresCluster:
    def __init__(self, port: int) -> None:
        self.bin = server_bin_dir()
        self.port = port
        self.folder = Path(tempfile.mkdtemp(prefix="parrot-pg-"))
        self.data = self.folder / "data"
        self.as_root = os.geteuid() == 0
        self.process: subprocess.Popen | None = None
        self._databases = 0
        self.version = ""

    def _as_owner(self) -> dict:
        """Popen arguments that run a server binary as the cluster's owner."""
        owner = {"user": "postgres", "group": "postgres", "extra_groups": []} if self.as_root else {}
        return {**owner, "cwd": self.folder}

    def start(self) -> PostgresCluster:
        if self.as_root:
            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
        init = subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", USER, "-E", "UTF8"],
            capture_output=True,
            text=True,
            **self._as_owner(),
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stdout}{init.stderr}")
        self.process = subprocess.Popen(
            [
                str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-k", str(self.folder), "-h", "127.0.0.1",
                # a test cluster: durability is not wanted, speed is
                "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            **self._as_owner(),
        )
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER],
                capture_output=True,
            )
            if ready.returncode == 0:
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not start: {self.process.stderr.read()}")
            time.sleep(0.1)
        self.version = subprocess.run(
            [str(self.bin / "postgres"), "--version"], capture_output=True, text=True
        ).stdout.strip()
        return self

    def create_database(self) -> str:
        """A new, empty database: its SQLAlchemy URL (asyncpg)."""
        self._databases += 1
        name = f"parrot_{self._databases}"
        subprocess.run(
            [str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name],
            check=True,
            capture_output=True,
        )
        return f"postgresql+asyncpg://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)
