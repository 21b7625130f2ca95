"""The ``parrot`` command's logging: one handler on stderr, text or JSON lines
(``python-json-logger``), the level from ``--log-level``. Libraries that log every request
(httpx: an engine ping a second) or every migration step (Alembic) are kept to warnings.
Repeated lines are rate-limited (:class:`RepeatFilter`: 10 similar records a minute, then a
count of those suppressed), so a flood of bad clients cannot fill the disk with one line."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

from parrot.cli.log_limit import RepeatFilter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
CHATTY = ("httpx", "httpx2", "alembic")  # a line per engine request or ping, per migration step
LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str, json_lines: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        renames = {"levelname": "level", "asctime": "time"}
        handler.setFormatter(JsonFormatter(JSON_FIELDS, rename_fields=renames))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
