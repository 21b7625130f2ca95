"""The paper's workloads as a benchmark suite: Parrot (SDK, semantic variables) against a
request-level baseline on the engine's own ``/v1``, with simulated client-server round trips.

``parrot bench WORKLOAD`` (or ``python -m benchmarks.apps WORKLOAD``) runs one; see
``docs/benchmarks.md`` for what each measures.
"""
