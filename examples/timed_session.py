"""A helper of the LangChain examples: run a runnable in an SDK session of its own and
report its output, the seconds it took and the server's record of every call it made."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from langchain_core.runnables import Runnable

from parrot.sdk import Client


def run_in_session(client: Client, runnable: Runnable, inputs: Any) -> dict:
    with client.session() as session:  # Parrot models called inside put their calls here
        start = time.perf_counter()
        output = runnable.invoke(inputs)
        seconds = time.perf_counter() - start
        calls = [msgspec.to_builtins(call) for call in session.info().calls]
    return {"output": output, "seconds": round(seconds, 3), "calls": calls}
