"""The dashboard's Jinja environment: templates from ``web/templates``, autoescaped."""

from __future__ import annotations

import time
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

TEMPLATES = Path(__file__).parent / "templates"


def ago(ts: float | None) -> str:
    if ts is None:
        return "—"
    s = max(0.0, time.time() - ts)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def clock(ts: float | None) -> str:
    return "—" if ts is None else time.strftime("%H:%M:%S", time.localtime(ts))


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(ago=ago, seconds=seconds, clock=clock, percent=percent)
    return env
