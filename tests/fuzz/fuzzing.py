"""A schemathesis run over every operation of an OpenAPI schema, counted case by case.

Each operation is fuzzed in both of schemathesis' generation modes (data that fits the
schema, and data that breaks it), ``examples`` cases each. Every answer is checked against
the schema (status documented, content type, body and headers conforming), must not be a
5xx, and a request that breaks the schema must be refused. Failures are collected, not
raised at the first, so a run reports how many cases failed and how (one line per case).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import requests
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import APIOperation, BaseSchema, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
REQUEST_TIMEOUT_S = 60.0
SLOW_S = 2.0

# Rewrites a case before it is sent (real ids, credentials, small sizes), with a seeded
# random source so a run is reproducible.
Prepare = Callable[[Case, random.Random], None]


@dataclass
class FuzzReport:
    name: str
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    per_operation: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # one line per failing case
    seconds: Counter = field(default_factory=Counter)  # per operation: generating and calling
    slow: list[str] = field(default_factory=list)  # cases answered after more than SLOW_S

    def summary(self) -> str:
        statuses = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items()))
        lines = [
            f"{self.name}: {self.cases} cases over {len(self.per_operation)} operations, "
            f"{len(self.failures)} failed; statuses {statuses}"
        ]
        slowest = ", ".join(f"{op} {t:.1f}s" for op, t in self.seconds.most_common(5))
        lines.append(f"  slowest operations: {slowest}")
        lines += [f"  slow case: {line}" for line in self.slow]
        return "\n".join(lines + [f"  FAILED {line}" for line in self.failures])


def fuzz(schema: BaseSchema, name: str, prepare: Prepare, examples: int, run_seed: int) -> FuzzReport:
    """Fuzz every operation of ``schema``; ``examples`` cases per operation and mode at most
    (fewer where the schema allows fewer distinct requests)."""
    report = FuzzReport(name)
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()  # a schema schemathesis cannot read fails the run here
            for mode in MODES:
                _fuzz_operation(operation, mode, prepare, examples, run_seed, session, report)
    return report


def _fuzz_operation(
    operation: APIOperation,
    mode: GenerationMode,
    prepare: Prepare,
    examples: int,
    run_seed: int,
    session: requests.Session,
    report: FuzzReport,
) -> None:
    @seed(run_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=operation.as_strategy(generation_mode=mode), rnd=st.randoms(use_true_random=False))
    def one_case(case: Case, rnd: random.Random) -> None:
        prepare(case, rnd)
        report.cases += 1
        report.per_operation[operation.label] += 1
        sent = time.monotonic()
        try:
            response = case.call(session=session, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as error:  # no answer in time, or the connection broke
            report.failures.append(
                f"{operation.label} [{mode.value}] -> {error!r} | {case.as_curl_command()[:400]}"
            )
            return
        if (took := time.monotonic() - sent) > SLOW_S:
            report.slow.append(f"{took:.1f}s {response.status_code} {case.as_curl_command()[:300]}")
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as group:
            for failure in group.exceptions:
                first_line = failure.message.splitlines()[0] if failure.message else ""
                report.failures.append(
                    f"{operation.label} [{mode.value}] -> {response.status_code}: {failure.title}: "
                    f"{first_line} | {case.as_curl_command()[:400]}"
                )

    start = time.monotonic()
    try:
        one_case()
    except Unsatisfiable:  # nothing to break in an operation without inputs (GET /ping)
        assert mode == GenerationMode.NEGATIVE, operation.label
    report.seconds[operation.label] += time.monotonic() - start
