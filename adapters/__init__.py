"""Adapters that run other frameworks' applications on Parrot: :mod:`parrot.adapters.langchain`."""
