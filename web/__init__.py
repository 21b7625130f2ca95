"""The operator dashboard: server-rendered pages (Jinja, inline SVG, htmx with SSE) served
by the same Litestar app as the Parrot API. See ``web/README.md``."""
