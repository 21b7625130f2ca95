"""Typed results of the Parrot REST API: the server's own response bodies
(:mod:`parrot.wire.responses`, :mod:`parrot.wire.adapter_bodies`), decoded
from its JSON."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from parrot.wire.adapter_bodies import (  # noqa: F401 (re-exported)
    CallUsage,
    RenderedChat,
    SessionUsage,
)
from parrot.wire.responses import (  # noqa: F401 (re-exported)
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
    """Prometheus text -> {``name{labels}``: value} (labels as the server wrote them),
    parsed by ``prometheus_client``."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return samples
