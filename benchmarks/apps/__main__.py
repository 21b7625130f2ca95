"""``python -m benchmarks.apps WORKLOAD [...]`` (from the repository root): as ``parrot bench``."""

from benchmarks.apps.cli import main

main()
