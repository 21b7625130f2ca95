"""URLs as they may be shown: without credentials, query or fragment.

An engine's URL may carry secrets (``http://user:password@host/v1``, or a key in its
query); what is shown (API responses, the dashboard, logs, error messages) is only its
scheme, host, port and path.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit, urlunsplit

INVALID = "<invalid url>"


def public_url(url: str) -> str:
    """``url`` without userinfo, query or fragment (and without a trailing slash)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{parts.port}" if parts.port is not None else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")
    except ValueError:
        return INVALID


def has_secrets(url: str) -> bool:
    """Whether ``url`` carries more than :func:`public_url` shows."""
    return public_url(url) != url.strip().rstrip("/")


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` without its userinfo, and the (user, password) it held (None: none).

    HTTP clients get the credentials as their ``auth`` rather than inside the URL: clients
    log the URLs they request (httpx at INFO), and a URL must never carry a password there.
    """
    parts = urlsplit(url.strip())
    if parts.username is None and parts.password is None:
        return url, None
    netloc = parts.netloc.rpartition("@")[2]  # host and port as given (checked elsewhere)
    bare = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return bare, (unquote(parts.username or ""), unquote(parts.password or ""))
