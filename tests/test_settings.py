"""``parrot serve``'s settings: one frozen object from flags and PARROT_* variables; its logs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import sys

import httpx
import pytest
from conftest import REPO_ROOT, free_port, parrot_process

from parrot.cli.settings import ServeSettings, add_serve_arguments
from parrot.platform.serve.ops.activity import ActivityLog


def settings(argv: list[str], env: dict[str, str] | None = None) -> ServeSettings:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser, env or {})
    return ServeSettings.from_args(parser.parse_args(argv))


def test_defaults_are_documented_values():
    s = settings([])
    assert (s.host, s.port, s.engine_urls, s.start_engine) == ("127.0.0.1", 9000, (), True)
    assert s.health.interval_s == 1.0 and s.engine.request_timeout_s == 600.0 and s.engine.parent_wait_s == 10
    assert (s.pressure.high, s.pressure.low, s.engine.openai_capacity) == (0.9, 0.75, 16)
    assert s.policy.cluster_min_shared == 64 and s.policy.criteria
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1


def test_variables_set_defaults_and_flags_win():
    env = {
        "PARROT_PORT": "9100",
        "PARROT_ENGINES": "http://a:1, http://b:2",
        "PARROT_PING_INTERVAL": "0.5",
        "PARROT_MEMORY_HIGH": "0.8",
        "PARROT_OPENAI_API_KEYS": "k1,k2",
        "PARROT_DB": "postgresql+asyncpg://parrot@127.0.0.1/parrot",
    }
    s = settings(["--port", "9200", "--memory-low", "0.5", "--no-criteria"], env)
    assert s.port == 9200 and s.engine_urls == ("http://a:1", "http://b:2")
    assert s.health.interval_s == 0.5 and (s.pressure.high, s.pressure.low) == (0.8, 0.5)
    assert s.openai_api_keys == ("k1", "k2") and s.db.startswith("postgresql+asyncpg://")
    assert not s.policy.criteria
    assert "k1" not in repr(s)  # keys are secrets


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"PARROT_PING_TIMEOUT": "soon"}, "PARROT_PING_TIMEOUT='soon'"),
        (["--memory-high", "0.5", "--memory-low", "0.7"], {}, "low <= high"),
        (["--ping-interval", "0"], {}, "positive"),
        (["--port", "0"], {}, "ports"),
    ],
)
def test_bad_settings_are_clear_errors(argv, env, message):
    with pytest.raises(ValueError, match=message):
        settings(argv, env)


@pytest.mark.spawns
def test_a_bad_variable_stops_the_command_with_one_line():
    out = subprocess.run(
        [sys.executable, "-m", "parrot.cli.main", "serve", "--help"],
        cwd=REPO_ROOT,
        env={"PARROT_SESSION_TIMEOUT": "forever", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "parrot: PARROT_SESSION_TIMEOUT='forever': could not convert string to float: 'forever'"
    ]


def test_calls_log_a_line_at_debug_and_a_summary_per_interval(caplog):
    caplog.set_level(logging.DEBUG, logger="parrot.activity")
    activity = ActivityLog(interval_s=60)
    activity.summarize(sessions=0, queued=0)  # nothing happened: nothing written
    assert not caplog.records
    for n, error in enumerate((None, None, "engine lost")):
        activity.call_finished(f"call-{n}", "failed" if error else "done", 0.5, "engine-1", error)
    activity.summarize(sessions=2, queued=1)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(debug) == 3 and debug[2].startswith("call call-2 failed in 0.500 s on engine-1: engine lost")
    assert len(info) == 1 and "2 calls done, 1 failed, 0.50 s per call; 2 sessions, 1 tasks queued" in info[0]


@pytest.mark.spawns
def test_log_json_writes_json_lines(tmp_path):
    code = (
        "import logging; from parrot.cli.logs import configure_logging;"
        "configure_logging('info', json_lines=True); logging.getLogger('parrot.x').info('hello %s', 'there');"
        "logging.getLogger('alembic.runtime.migration').info('Context impl SQLiteImpl.')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    assert len(lines) == 1  # Alembic's chatter is kept to warnings
    (line,) = lines
    assert (line["message"], line["level"], line["name"]) == ("hello there", "INFO", "parrot.x")


@pytest.mark.spawns
def test_serve_starts_quietly_and_logs_json(tmp_path):
    """``parrot --log-json --log-level debug serve``: every log line is JSON, and Alembic's
    plugin and migration chatter stays out of the log (a real start, migrations included)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARROT_")}
    args = ["--log-json", "--log-level", "debug", "serve", "--no-engine", "--port", str(port)]
    args += ["--data-dir", str(tmp_path), "--admin-token", "t"]
    with parrot_process(args, env, lambda: httpx.get(f"{url}/healthz", timeout=2).is_success, "serve") as out:
        assert httpx.get(f"{url}/v1/engines", timeout=5).json() == []
    lines = [line for line in out[0].splitlines() if line.strip()]
    logged = [json.loads(line) for line in lines if line.startswith("{")]
    printed = [line for line in lines if not line.startswith("{")]
    announced = f"parrot serve: Parrot API on {url} with engines []; dashboard on {url}/"
    assert printed == [announced, "parrot serve: stopped"]
    assert all({"time", "level", "name", "message"} <= record.keys() for record in logged)
    access = [r for r in logged if r["name"] == "parrot.access"]  # the request's line, its fields as keys
    assert [(r["method"], r["route"], r["status"]) for r in access] == [("GET", "/v1/engines", 200)]
    assert access[0]["duration_ms"] >= 0 and access[0]["bytes"] == 2
    assert not [r for r in logged if r["name"].startswith("alembic")]
    assert (tmp_path / "parrot.db").exists()  # migrated
