"""Semantic variables: their values, formats, readiness and streams."""
