"""The values of semantic variables: values and errors arrive, waiters wake.

The waiting state is each variable's own event (:attr:`SemanticVariable.settled`), so it
goes with the variable when its session goes; nothing here is keyed by variable.

Every value and reason kept here is valid text (storable, encodable as JSON): a produced
value that is not (a lone surrogate) fails its variable with that reason instead, and a
reason that quotes one gets it escaped. A typed variable's value must match its format
(:mod:`parrot.platform.serve.variables.formats`): whatever engine produced it, a value that does
not fails the variable with what did not match, and is never stored as valid. A value
past the memory bound of values (:class:`~parrot.platform.serve.limits.value_budget.ValueBudget`)
fails its variable with the limit it would pass, and is not kept.
"""

from __future__ import annotations

from collections.abc import Iterable

from parrot.engines.protocol import text
from parrot.platform.serve.limits.value_budget import ValueBudget
from parrot.platform.serve.variables.formats import mismatch
from parrot.platform.serve.variables.variable import SemanticVariable


class VariableValues:
    """Sets values and errors (a client's value through the variable service, a produced one
    through the call driver, which journals it) and wakes whoever waits."""

    def __init__(self, budget: ValueBudget) -> None:
        self.budget = budget  # charged every value kept

    def set_value(
        self, var: SemanticVariable, value: str, finish_reason: str | None = None, checked: bool = False
    ) -> None:
        """``finish_reason``: its producer's, for those who stream it; ``checked``: the value
        was checked against the variable's format already (a client's, off the loop)."""
        if var.ready or var.error is not None:
            return  # settled once: a late result (a task that ran twice) changes nothing
        why = text.problem(value)
        if why is not None:
            self.fail(var, f"the value produced is not valid text: {why}")
            return
        why = None if var.format is None or checked else mismatch(var.format, value)
        if why is not None:
            self.fail(
                var, f"the value produced does not match the {var.format.kind} format of {var.name!r}: {why}"
            )
            return
        why = self.budget.admit(var.var_id, value)  # a client's value was charged when set
        if why is not None:
            self.fail(var, why)
            return
        var.value = value
        var.settled.set()
        var.end_stream(finish_reason)  # its readers end with the value

    def fail(self, var: SemanticVariable, error: str) -> None:
        if var.ready or var.error is not None:
            return
        var.error = text.printable(error)
        var.settled.set()
        var.end_stream()  # its readers end with the error

    def close(self, variables: Iterable[SemanticVariable], reason: str) -> None:
        """Their session is gone: whoever still waits on one of them wakes with ``reason``
        (nothing is recorded: the session's records go with it)."""
        for var in variables:
            if not var.ready and var.error is None:
                var.error = reason
                var.settled.set()
                var.end_stream()
