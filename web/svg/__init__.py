"""Inline SVG pictures drawn by the server: DAGs, context trees, charts.

Every piece of text that reaches an SVG goes through :func:`text` (escaped); the pictures
are returned as ``Markup`` so templates insert them without escaping them twice."""

from __future__ import annotations

from markupsafe import Markup, escape


def text(value: object, limit: int | None = None) -> Markup:
    """Escaped text for SVG, cut to ``limit`` characters (with an ellipsis)."""
    s = str(value)
    if limit is not None and len(s) > limit:
        s = s[: max(1, limit - 1)] + "…"
    return escape(s)


def num(x: float) -> str:
    """A coordinate, short."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


__all__ = ["Markup", "num", "text"]
