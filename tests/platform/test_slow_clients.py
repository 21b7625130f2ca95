"""Slow clients against a real ``parrot serve`` (issue 14, item 2): connections that trickle
their request head must not exhaust the server's file descriptors, keep ``/healthz`` from
answering, or flood its log."""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import subprocess
import sys
import time
from contextlib import suppress

import httpx
import pytest
from conftest import REPO_ROOT, free_port

from benchmarks.reliability.flood import slow_flood
from benchmarks.reliability.health import probe_health
from parrot.cli.log_limit import RepeatFilter
from parrot.cli.settings import ServeSettings, add_serve_arguments
from parrot.engines.protocol.server import ServerLimits

FD_LIMIT = 256  # the server's open-file limit (hard): a quick flood of 400 would exhaust it


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _serve(tmp_path, *flags: str) -> tuple[subprocess.Popen, str, object]:
    port = free_port()
    log = open(tmp_path / "serve.log", "w+b")  # noqa: SIM115 - closed by the test
    args = ["serve", "--no-engine", "--port", str(port), "--admin-token", "admin"]
    args += ["--data-dir", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "parrot.cli.main", *args, *flags],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_low_fd_limit,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "parrot serve did not start"
        time.sleep(0.3)


async def _flood_while_probing(url: str, port: int, connections: int, duration_s: float):
    stop = asyncio.Event()
    probing = asyncio.create_task(probe_health(url, stop, interval_s=0.05, timeout_s=2.0))
    flood = await slow_flood("127.0.0.1", port, connections, duration_s, trickle_s=0.5)
    stop.set()
    return flood, await probing


@pytest.mark.spawns
def test_slow_clients_are_cut_off_and_healthz_stays_up(tmp_path):
    """400 slow clients against a server allowed 256 open files and 128 connections, with a
    2 s header timeout: every ``/healthz`` probe (a fresh connection every 50 ms) answers
    within 2 s, each slow client is closed (408) within the timeout plus slack, and the log
    holds a few lines, not one per client. Before the fix the slow clients held every
    file descriptor: the probes could not connect."""
    proc, url, log = _serve(tmp_path, "--header-timeout", "2", "--max-connections", "128")
    try:
        port = int(url.rsplit(":", 1)[1])
        flood, probe = asyncio.run(_flood_while_probing(url, port, connections=400, duration_s=6.0))
        summary = probe.summary()
        print(
            f"healthz under 400 slow clients: {summary}; flood: {flood.closed} closed, "
            f"{flood.answered_408} x 408, {flood.still_open} still open"
        )
        assert not probe.failures, probe.failures[:5]
        assert summary["probes"] > 30
        assert flood.still_open == 0, "the server kept slow clients open past their header timeout"
        assert flood.answered_408 > 0
        assert max(flood.lifetimes_s) < 2.0 + 1.5
        # the server is still healthy afterwards
        assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    output = (tmp_path / "serve.log").read_bytes()
    assert len(output) < 8_000, output[-2000:]
    # ~270 slow clients were closed to make room: a warning each, 10 of them logged
    assert 1 <= output.count(b"connection limit") <= RepeatFilter().burst, output[-2000:]


@pytest.mark.spawns
def test_a_slow_body_is_cut_off_and_the_server_goes_on(tmp_path):
    """A client that sends a request head announcing a body, then trickles the body, gets
    408 after the body timeout (before the fix it held the connection and a task for as long
    as it liked)."""
    proc, url, log = _serve(tmp_path, "--body-timeout", "1.5")
    try:
        port = int(url.rsplit(":", 1)[1])

        async def slow_body() -> tuple[bytes, float]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = time.monotonic()
            head = b"POST /v1/semantic_var HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            writer.write(head + b"Content-Length: 1000\r\n\r\n{")
            try:
                while True:
                    try:
                        data = await asyncio.wait_for(reader.read(256), timeout=0.3)
                        return data, time.monotonic() - start
                    except TimeoutError:
                        writer.write(b" ")
                        await writer.drain()
                    assert time.monotonic() - start < 10, "the slow body was never cut off"
            finally:
                writer.close()

        data, after = asyncio.run(slow_body())
        assert data.startswith(b"HTTP/1.1 408") or data == b"", data
        assert 1.0 < after < 4.0
        assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_a_body_past_the_limit_closes_its_connection_even_where_no_handler_reads_it(tmp_path):
    """Issue 37 (9): ``POST /v1/session`` read no body then, so a chunked body that never
    ended was answered 201 and went on arriving until the body timeout; the apps' body limit
    applies only to a body a handler reads. The server counts every body as it arrives:
    past ``--max-body-bytes`` its connection closes (413 where nothing was answered yet).
    (``POST /v1/session`` now reads its optional body: a route that reads none is a
    ``DELETE``, answered at once.)"""
    proc, url, log = _serve(tmp_path, "--max-body-bytes", "100000")
    try:
        port = int(url.rsplit(":", 1)[1])

        async def endless(path: bytes, method: bytes = b"POST") -> tuple[bytes, int]:
            """A chunked body sent without end: what came back, and the bytes sent."""
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
            chunk, sent, answer = b"1000\r\n" + b" " * 4096 + b"\r\n", 0, b""
            try:
                while sent < 10_000_000:  # 100x the limit: the server must have closed
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(chunk)
                    with suppress(TimeoutError):
                        answer += await asyncio.wait_for(reader.read(4096), timeout=0.001)
                        if reader.at_eof():
                            break
            except ConnectionError:
                pass
            finally:
                writer.close()
            with suppress(ConnectionError, TimeoutError):
                answer += await asyncio.wait_for(reader.read(), timeout=2)
            return answer, sent

        # Answered (no such session) before the body ends: the body is cut off all the same.
        answer, sent = asyncio.run(endless(b"/v1/session/no-such-session", b"DELETE"))
        assert sent < 1_000_000, sent
        assert answer.startswith((b"HTTP/1.1 401", b"HTTP/1.1 404")), answer[:200]
        answer, sent = asyncio.run(endless(b"/v1/semantic_var"))  # a handler waits for the body
        assert sent < 1_000_000 and answer.startswith(b"HTTP/1.1 413"), answer[:300]
        assert b"max_body_bytes = 100000" in answer
        assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_repeated_log_lines_are_suppressed_and_counted():
    """The filter of the ``parrot`` command's log handler (a unit test, with a fake clock)."""
    now = [0.0]
    limit = RepeatFilter(burst=3, window_s=10.0, clock=lambda: now[0])

    def record(msg: str, *args) -> logging.LogRecord:
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, args, None)

    passed = [limit.filter(record("client %s too slow", i)) for i in range(100)]
    assert sum(passed) == 3
    assert limit.filter(record("another message"))  # another template is not held back
    now[0] = 11.0
    later = record("client %s too slow", 101)
    assert limit.filter(later)
    assert "[97 similar messages suppressed in the last 10 s]" in later.getMessage()
    debug = logging.LogRecord("x", logging.DEBUG, __file__, 1, "trace", (), None)
    assert all(limit.filter(debug) for _ in range(100))  # asked-for traces are never dropped


def test_server_limits_come_from_flags_and_variables_with_documented_defaults():
    def settings(argv: list[str], env: dict[str, str]) -> ServeSettings:
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser, env)
        return ServeSettings.from_args(parser.parse_args(argv))

    assert settings([], {}).server == ServerLimits(10.0, 60.0, 5.0, 2048, max_body_bytes=32 * 2**20)
    env = {"PARROT_HEADER_TIMEOUT": "3", "PARROT_MAX_CONNECTIONS": "64"}
    limits = settings(["--max-connections", "32", "--body-timeout", "7"], env).server
    assert (limits.header_timeout_s, limits.body_timeout_s, limits.max_connections) == (3.0, 7.0, 32)
    with pytest.raises(ValueError, match="max_connections"):
        settings(["--max-connections", "0"], {})
    with pytest.raises(ValueError, match="header_timeout_s"):
        settings(["--header-timeout", "0"], {})
