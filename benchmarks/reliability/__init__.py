"""Reliability workloads: slow-client floods, ``/healthz`` probes, concurrent session DAGs.
Used by the load and fault tests (quick sizes) and by ``benchmarks/reliability_load.py``
(full sizes, figures in ``docs/reliability.md``)."""
