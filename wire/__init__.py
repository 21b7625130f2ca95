"""The wire contract of Parrot: what a client and the server say to each other.

Request and response bodies (msgspec structs: ``bodies``, ``responses``, ``transforms``),
sampling parameters, the OpenAI-compatible schemas, the prompt-template grammar and the one
error hierarchy (``errors``: every class with its status and code). Shared by the
client (``parrot.sdk``, ``parrot.adapters``) and the server (``parrot.platform``,
``parrot.engines``), so both sides agree by construction; it imports only msgspec and the
standard library, which is what lets ``pip install parrot-serve`` give a client without the
server's dependencies (tests/test_layout.py keeps it that way).
"""
