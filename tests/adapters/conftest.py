"""Parrot's LangChain models on a Parrot server (``server_url``, tests/conftest.py: the API on
the fake engine unless a test asks for the real ``parrot serve``)."""

from __future__ import annotations

import httpx
import pytest

from parrot.adapters.langchain import ParrotChatModel, ParrotLLM
from parrot.sdk.results import parse_metrics

SHORT = {"max_tokens": 8, "temperature": 0}


@pytest.fixture
def llm(server_url) -> ParrotLLM:
    return ParrotLLM(base_url=server_url, **SHORT)


@pytest.fixture
def chat(server_url) -> ParrotChatModel:
    return ParrotChatModel(base_url=server_url, **SHORT)


def metric(url: str, name: str) -> float:
    """One sample of the server's /metrics (``name`` with its labels)."""
    samples = parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)
    if name not in samples:
        raise AssertionError(f"no metric {name}")
    return samples[name]


def gets(url: str) -> float:
    """How many gets of variables the server has answered (each waited for a value)."""
    return metric(url, "parrot:sv_wait_seconds_count")


def submitted_before_any_finished(calls) -> bool:
    """Server clock: every call (a CallInfo, or one as a dict) was on the server before the
    first of them had finished."""
    timings = [c["timings"] if isinstance(c, dict) else c.timings for c in calls]
    return max(t["submitted_at"] for t in timings) <= min(t["finished_at"] for t in timings)
