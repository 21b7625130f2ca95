"""Semantic calls: built into a session's DAG, stored, run, and their state advanced."""
