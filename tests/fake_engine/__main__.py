"""The fake engine as a process of its own (``python -m fake_engine --port P`` with tests/ on
the path), for the tests that stop or kill an engine (SIGSTOP, SIGKILL) without loading a
model. ``--step-s``: seconds per generated token."""

from __future__ import annotations

import argparse

import uvicorn

from fake_engine.engine import FakeEngine
from fake_engine.server import create_app


def main() -> None:
    parser = argparse.ArgumentParser(prog="fake_engine")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--step-s", type=float, default=0.0)
    args = parser.parse_args()
    engine = FakeEngine(step_s=args.step_s)
    uvicorn.run(create_app(lambda: engine), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
