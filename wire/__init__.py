"""The wire contract of Parrot: what a client and the server say to each other.

Request and response bodies (msgspec structs), sampling parameters, the OpenAI-compatible
schemas, the prompt-template grammar and the root of the error hierarchy. Shared by the
client (``parrot.sdk``, ``parrot.adapters``) and the server (``parrot.platform``,
``parrot.engines``), so both sides agree by construction; it imports only msgspec and the
standard library, which is what lets ``pip install parrot-serve`` give a client without the
server's dependencies (tests/test_layout.py keeps it that way).
"""
