"""What a batch of the journal's writes costs on SQLite: the store's way against two others.

    python benchmarks/store_writes.py [--apps 16] [--batches 30] [--rounds 3]

One batch is what a burst of agent applications submitted at once writes in one
transaction: per application its session, three calls and seven variables, as the ServeCore
stores them before the calls start, then the three calls' states and values (in that order:
the journal's batches). Three ways,
alternating, each ``--rounds`` times:

- ``store``: :meth:`Store.write` (new rows in one statement a table, cached update
  statements, through the async engine: aiosqlite, a hop to its thread per statement);
- ``orm``: mapped objects added to an async ORM session, flushed per write, and ORM
  updates: the store's way before 2026-11-30;
- ``one hop``: the store's statements on a synchronous engine, the whole batch in one hop to
  a writer thread (tried and dropped: its Python holds the GIL the event loop waits for).

Printed: ms per batch, median (min-max) over the rounds (each round's median batch), also
written to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sqlalchemy import create_engine, event, make_url, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from benchmarks._report import machine, write_section
from parrot.platform.store.models import (
    CallRecord,
    SessionRecord,
    VariableRecord,
    call_record,
    now,
    var_record,
)
from parrot.platform.store.store import Store, _sqlite_pragmas, sqlite_url
from parrot.platform.store.writes import StoreWrites

WAYS = ("store", "orm", "one hop")


def seal(url: str, secrets: dict) -> tuple[str, None]:
    return url, None  # (no engine rows here)


def application(tag: str) -> tuple[str, list[dict], list[dict]]:
    """A session id, its calls' rows and its variables' rows."""
    params = [{"name": "task", "is_output": False, "var_id": f"v-{tag}-0"}]
    calls = [
        call_record(
            f"c-{tag}-{i}", tag, i, "Team notes ... {{task}} {{code}}" * 8, params, timings={"at": 1.0}
        )
        for i in range(3)
    ]
    variables = [var_record(f"v-{tag}-{i}", tag, f"name{i}", "a value " * 12) for i in range(7)]
    return tag, calls, variables


async def batch(store: Store, way: str, apps: list[tuple[str, list[dict], list[dict]]], hop: OneHop) -> None:
    writes = []  # as the journal sees them: the applications submitted, then their calls' states
    for sid, calls, variables in apps:
        writes += [
            lambda db, sid=sid: db.add_session(sid, "h" * 64),
            lambda db, c=calls, v=variables: db.add_calls(c, v),
        ]
    for _, calls, variables in apps:
        writes += [
            lambda db, c=c: db.update_call(c["call_id"], state="done", timings={"at": 2.0}) for c in calls
        ]
        writes += [lambda db, v=v: db.set_var_value(v["var_id"], "an answer " * 12) for v in variables[:3]]
    if way == "store":
        await store.write(*writes)
    elif way == "one hop":
        await hop.write(writes)
    else:
        async with async_sessionmaker(store.engine).begin() as db:
            for sid, calls, variables in apps:
                db.add(
                    SessionRecord(session_id=sid, auth_hash="h" * 64, created_at=now(), last_active_at=now())
                )
                await db.flush()
                db.add_all([VariableRecord(**v) for v in variables] + [CallRecord(**c) for c in calls])
                await db.flush()
            for _, calls, variables in apps:
                for c in calls:
                    done = {"state": "done", "timings": {"at": 2.0}}
                    await db.execute(
                        update(CallRecord).where(CallRecord.call_id == c["call_id"]).values(**done)
                    )
                for v in variables[:3]:
                    value = {"value": "an answer " * 12, "updated_at": now()}
                    await db.execute(
                        update(VariableRecord).where(VariableRecord.var_id == v["var_id"]).values(**value)
                    )


class OneHop:
    """The tried way: a synchronous engine on the same file, a batch in one thread hop."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(make_url(url).set(drivername="sqlite"))
        event.listen(self.engine, "connect", _sqlite_pragmas)
        self.thread = ThreadPoolExecutor(1)

    async def write(self, writes: list) -> None:
        def run() -> None:
            with self.engine.begin() as conn:
                statements = StoreWrites(conn, seal)
                for write in writes:
                    write(statements)

        await asyncio.get_running_loop().run_in_executor(self.thread, run)

    def close(self) -> None:
        self.thread.shutdown()
        self.engine.dispose()


async def measure(apps: int, batches: int, rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="parrot-writes-") as tmp:
        store = Store(sqlite_url(Path(tmp)))
        await store.migrate()
        hop = OneHop(store.url)
        try:
            for n in range(rounds):
                for way in WAYS if n % 2 == 0 else tuple(reversed(WAYS)):
                    times = []
                    for b in range(batches):
                        rows = [application(f"{WAYS.index(way)}-{n}-{b}-{a}") for a in range(apps)]
                        start = time.perf_counter()
                        await batch(store, way, rows, hop)
                        times.append(1000 * (time.perf_counter() - start))
                    results[way].append(statistics.median(times))
        finally:
            hop.close()
            await store.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", type=int, default=16, help="applications per batch")
    parser.add_argument("--batches", type=int, default=30, help="batches per way and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = asyncio.run(measure(args.apps, args.batches, args.rounds))
    base = statistics.median(results["store"])
    rows = ["| way | ms per batch | against `store` |", "| --- | ---: | ---: |"]
    for way, values in results.items():
        mid = statistics.median(values)
        rows.append(f"| {way} | {mid:.1f} ({min(values):.1f}-{max(values):.1f}) | {mid / base:.1f}x |")
    table = "\n".join(rows)
    print(table)
    write_section(
        "store-writes",
        "### A batch of the journal's writes on SQLite (`benchmarks/store_writes.py`)\n\n"
        f"{machine()}. A batch: {args.apps} applications' sessions, 3 calls and 7 variables each, then the "
        f"calls' states and 3 values each, in one transaction; {args.batches} batches per way and round, "
        f"{args.rounds} rounds, the ways alternating; "
        "median (min-max) over the rounds' medians. `store`: `Store.write` (rows and cached statements "
        "through aiosqlite); `orm`: mapped objects flushed per write (the store before); `one hop`: the "
        "store's statements in one hop to a writer thread (tried and dropped: see platform/store/writes.py)."
        "\n\n" + table,
    )


if __name__ == "__main__":
    main()
