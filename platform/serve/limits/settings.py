"""What one client may ask of a ServeCore: sizes (413 beyond them), counts (429) and the
memory that variable values hold (507 for the server's bound, 429 for one client's share).

The defaults are far above what a normal application or the benchmarks use; they exist so
that one client cannot take all of the server's memory or queue. Each is a ``parrot serve``
flag and a ``PARROT_*`` variable (:mod:`parrot.cli.settings`); every refusal names
the limit and its value, so an operator knows what to raise.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class Limits:
    # 413: too large
    max_body_bytes: int = 32 * MiB  # one HTTP request body (the app's request_max_body_size)
    max_value_chars: int = 8 * MiB  # one variable's value, set by a client or given inline
    max_prompt_chars: int = 8 * MiB  # a call's template; an OpenAI-front prompt, all pieces
    max_format_chars: int = 64 * 1024  # an output's format (its JSON: a schema, regex, choices)
    # milliseconds to compile a client's format and prepare its first tokens at submit
    # (platform/serve/variables/formats.py FormatProbe): costlier formats are a 400
    max_format_probe_ms: int = 2000
    # a template's placeholders (``{{`` counted before parsing): each costs ~30 us of the event
    # loop to parse and bind, so 400,000 in a 2 MB template stalled it 11 s (issue 37)
    max_placeholders: int = 4096
    # The memory of the values held, in bytes (1 a character of ASCII or Latin-1 text, 2 or 4
    # in text with wider characters): 507 server-wide, 429 for one client's share.
    max_value_bytes: int = GiB  # every session's values together
    max_value_bytes_per_client: int = 256 * MiB  # the values of one client address's sessions
    # 429: too many
    max_sessions_per_client: int = 4096  # live sessions opened from one client address
    max_vars_per_session: int = 10_000
    max_calls_per_session: int = 10_000
    max_pending_calls: int = 10_000  # calls not finished yet, all sessions together
    max_subscribers_per_var: int = 64  # streams of one variable followed at once
    max_subscribers_per_session: int = 256  # streams of one session's variables at once

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {f.name} must be a positive integer, got {value!r}")


# The flag of each limit (``--max-value-chars`` ...) and its variable (PARROT_MAX_VALUE_CHARS).
def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return "PARROT_" + name.upper()


def describe(name: str, value: int) -> str:
    """How a refusal names a limit: ``max_value_chars = 8388608 (--max-value-chars)``."""
    return f"{name} = {value} ({flag(name)})"
