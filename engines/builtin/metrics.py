"""The builtin engine's Prometheus metrics, through ``prometheus_client``, in a registry of
the engine's own (several engines may live in one process, e.g. in tests).

Names follow vLLM's (``vllm:num_requests_running`` ...) with a ``parrot:`` prefix and a
``model_name`` label. Per-request latencies are histograms observed as generations end (on
the engine clock); the engine's state is read from its published snapshot at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from parrot.engines.builtin.jobs import GenerateResult
from parrot.engines.protocol.errors import EngineShutdownError

CONTENT_TYPE = "text/plain; version=0.0.4"  # the format of generate_latest (Litestar adds the charset)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
_GAUGES = (  # snapshot key, metric, help
    ("num_running", "parrot:num_requests_running", "Jobs in the running batch."),
    ("num_waiting", "parrot:num_requests_waiting", "Jobs waiting to be admitted."),
    ("num_contexts", "parrot:num_contexts", "Contexts on the engine."),
    ("kv_blocks_used", "parrot:kv_blocks_used", "KV-cache blocks in use."),
    ("kv_blocks_total", "parrot:kv_blocks_total", "KV-cache blocks in all."),
    ("tokens_per_s", "parrot:generation_tokens_per_second", "Tokens generated per second, recently."),
)
_COUNTERS = (
    ("tokens_computed", "parrot:computed_tokens", "Tokens run through the model (prompt and output)."),
    ("tokens_generated", "parrot:generation_tokens", "Tokens sampled."),
    ("tokens_forced", "parrot:jump_forward_tokens", "Tokens a format forced, filled unsampled."),
    ("steps", "parrot:engine_steps", "Model steps."),
    ("shared_prefix_steps", "parrot:shared_prefix_steps", "Steps with shared-prefix attention."),
    ("graph_steps", "parrot:graph_steps", "Decode steps replayed as CUDA graphs."),
    ("fused_steps", "parrot:fused_steps", "Decode steps run whole by the fused CPU step."),
    ("fill_steps", "parrot:fill_steps", "Steps that computed prompts only (sampled nothing)."),
    ("step_seconds", "parrot:step_seconds", "Wall time spent in steps."),
    ("preemptions", "parrot:num_preemptions", "Jobs preempted when KV blocks ran out."),
)


class EngineMetrics:
    def __init__(self, model_name: str, snapshot: Callable[[], dict]) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        common = {"labelnames": ["model_name"], "registry": self.registry}
        self.e2e = Histogram(
            "parrot:e2e_request_latency_seconds",
            "A generation from submission to its end.",
            buckets=LATENCY_BUCKETS,
            **common,
        ).labels(**labels)
        self.ttft = Histogram(
            "parrot:time_to_first_token_seconds",
            "A generation from submission to its first token.",
            buckets=LATENCY_BUCKETS,
            **common,
        ).labels(**labels)
        self.tpot = Histogram(
            "parrot:time_per_output_token_seconds",
            "Mean time between a generation's output tokens.",
            buckets=TOKEN_BUCKETS,
            **common,
        ).labels(**labels)
        self.registry.register(_SnapshotCollector(model_name, snapshot))

    def observe(self, result: GenerateResult) -> None:
        self.e2e.observe(result.seconds)
        self.ttft.observe(result.first_token_s)
        if len(result.token_ids) > 1:
            self.tpot.observe((result.seconds - result.first_token_s) / (len(result.token_ids) - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SnapshotCollector:
    def __init__(self, model_name: str, snapshot: Callable[[], dict]) -> None:
        self.model_name = model_name
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self.snapshot()
        except EngineShutdownError:
            return
        label = [self.model_name]
        for key, name, doc in _GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric(label, snap[key])
            yield gauge
        used, total = snap["kv_blocks_used"], snap["kv_blocks_total"]
        usage = GaugeMetricFamily(
            "parrot:kv_cache_usage_perc", "KV-cache use, 0 to 1.", labels=["model_name"]
        )
        usage.add_metric(label, used / total if total else 0.0)
        yield usage
        for key, name, doc in _COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric(label, snap[key])
            yield counter
