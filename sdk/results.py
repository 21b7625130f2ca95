"""Typed results of the Parrot REST API: the server's own response bodies
(:mod:`parrot.platform.api.responses`, :mod:`parrot.platform.api.adapter_bodies`), decoded
from its JSON."""

from __future__ import annotations

from parrot.platform.api.adapter_bodies import (  # noqa: F401 (re-exported)
    CallUsage,
    RenderedChat,
    SessionUsage,
)
from parrot.platform.api.responses import (  # noqa: F401 (re-exported)
    CallInfo,
    CallSubmitted,
    EngineInfo,
    Health,
    ParamInfo,
    SessionCreated,
    SessionInfo,
    VarInfo,
)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {``name{labels}``: value}; comment lines are skipped."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
