"""The ServeCore's Prometheus metrics, through ``prometheus_client``, in a registry of its own
(several ServeCores may live in one process, e.g. in tests).

Names follow vLLM's style with a ``parrot:`` prefix. Distributions (task time, time to
first token, time per output token, SV wait) are histograms observed as things happen;
counts the ServeCore keeps anyway (tasks done, prompt tokens, engines, ...) are read from
:meth:`OperatorViews.stats` at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from parrot.platform.serve.ops.views import CoreStats

CONTENT_TYPE = "text/plain; version=0.0.4"  # the format of generate_latest (Litestar adds the charset)
# Seconds: a task or a wait runs from milliseconds (a cached prefix, a ready SV) to minutes.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class ServeMetrics:
    """Histograms the ServeCore observes into, and the text of ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.task_seconds = Histogram(
            "parrot:task_seconds",
            "Time of a completion task on its engine (done tasks).",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.time_to_first_token = Histogram(
            "parrot:time_to_first_token_seconds",
            "From a streamed task's start on its engine to its first token.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.time_per_output_token = Histogram(
            "parrot:time_per_output_token_seconds",
            "Mean time between the output tokens of a streamed task.",
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.sv_wait = Histogram(
            "parrot:sv_wait_seconds",
            "Time a get of a semantic variable waited for its value.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )

    def observe_task(self, seconds: float, first_token_s: float | None, output_tokens: int) -> None:
        self.task_seconds.observe(seconds)
        if first_token_s is not None:
            self.time_to_first_token.observe(first_token_s)
            if output_tokens > 1:
                self.time_per_output_token.observe((seconds - first_token_s) / (output_tokens - 1))

    def observe_wait(self, seconds: float) -> None:
        self.sv_wait.observe(seconds)

    def render(self, stats: CoreStats) -> bytes:
        """The Prometheus text exposition (format 0.0.4): the histograms, and the counts of
        ``stats`` (taken by the caller at this scrape, so nothing here reads upwards)."""
        counts = CollectorRegistry()
        counts.register(_StatsCollector(stats))
        return generate_latest(self.registry) + generate_latest(counts)


class _StatsCollector:
    def __init__(self, stats: CoreStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        st = self.stats
        yield GaugeMetricFamily("parrot:num_sessions", "Live sessions.", value=st.sessions)
        yield GaugeMetricFamily("parrot:num_tasks_waiting", "Tasks in the global queue.", value=st.queued)
        yield GaugeMetricFamily(
            "parrot:value_bytes",
            "Memory of the variable values held (--max-value-bytes).",
            value=st.value_bytes,
        )
        tasks = CounterMetricFamily("parrot:tasks", "Completion tasks by outcome.", labels=["state"])
        for state, n in (("done", st.done), ("failed", st.failed), ("requeued", st.requeued)):
            tasks.add_metric([state], n)
        yield tasks
        prompt = CounterMetricFamily(
            "parrot:prompt_tokens",
            "Prompt tokens of started tasks: forked from a context on the engine, or computed.",
            labels=["source"],
        )
        prompt.add_metric(["forked"], st.reused_tokens)
        prompt.add_metric(["computed"], st.prompt_tokens - st.reused_tokens)
        yield prompt
        yield CounterMetricFamily(
            "parrot:filled_ahead_tokens",
            "Tokens filled before their call's inputs were all there.",
            value=st.filled_ahead,
        )
        yield CounterMetricFamily(
            "parrot:contexts_evicted", "Cached contexts freed under engine memory pressure.", value=st.evicted
        )
        tokenizer = CounterMetricFamily(
            "parrot:tokenizer_cache", "Prompt tokenizations found in the cache or not.", labels=["result"]
        )
        tokenizer.add_metric(["hit"], st.tokenizer_hits)
        tokenizer.add_metric(["miss"], st.tokenizer_misses)
        yield tokenizer
        yield CounterMetricFamily(
            "parrot:store_write_failures", "Writes to the SQL store that failed.", value=st.store_failures
        )
        labels = ["engine", "model"]
        up = GaugeMetricFamily("parrot:engine_up", "1 when the engine answers its pings.", labels=labels)
        running = GaugeMetricFamily("parrot:engine_running", "Tasks placed on the engine now.", labels=labels)
        contexts = GaugeMetricFamily(
            "parrot:engine_contexts", "Contexts the ServeCore holds on the engine.", labels=labels
        )
        for view in st.engines:
            key = [view.engine_id, view.model]
            up.add_metric(key, int(view.up))
            running.add_metric(key, view.running)
            contexts.add_metric(key, view.contexts)
        yield from (up, running, contexts)
