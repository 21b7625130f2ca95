"""Run a ``parrot`` command under the recorder, from its first line of Parrot on:

    PYTHONPATH=tests python -m tracing.run_traced OUT.json PROCESS -- serve --port ...

The profile function is installed in every thread before Parrot is imported, inactive.
``SIGUSR1`` activates it (then ``OUT.json.active`` exists); ``SIGUSR2`` stops it and writes
the log to ``OUT.json`` (else it is written when the command exits). ``PROCESS`` names the
process in the log (its rows' first column).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from tracing.recorder import Recorder

REPO_ROOT = Path(__file__).resolve().parents[2]
# The repository's code folders: a frame of a file under one of them is a project frame.
PROJECT_FOLDERS = ("platform", "engines", "wire", "web", "cli", "sdk")


def is_project(filename: str) -> bool:
    path = Path(filename)
    return path.is_relative_to(REPO_ROOT) and path.relative_to(REPO_ROOT).parts[0] in PROJECT_FOLDERS


def main(argv: list[str]) -> None:
    out, process, separator, *command = argv
    if separator != "--":
        sys.exit(__doc__)
    out_path = Path(out)
    recorder = Recorder(REPO_ROOT, is_project)

    def activate(signum: int, frame: object) -> None:
        recorder.active = True
        out_path.with_name(out_path.name + ".active").touch()

    def finish(signum: int | None = None, frame: object = None) -> None:
        if not out_path.exists():
            recorder.active = False
            recorder.dump(out_path, process)

    signal.signal(signal.SIGUSR1, activate)
    signal.signal(signal.SIGUSR2, finish)
    recorder.install()
    from parrot.cli.main import main as parrot

    try:
        parrot(command)
    finally:
        finish()


if __name__ == "__main__":
    main(sys.argv[1:])
