"""A tracer of the path of one call through real processes (see ``recorder`` for what it
records, ``causal`` for the rule that turns a record into the path, ``handoffs`` for the one
list of what counts as handing control on)."""
