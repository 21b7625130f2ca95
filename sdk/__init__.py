"""The Parrot SDK: ``from parrot.sdk import Client, AsyncClient, semantic_function, Input,
Output, ParrotError``. The same names live in :mod:`parrot.sdk.api` (kept for older code)."""

from parrot.sdk.api import *  # noqa: F403 (the public names, listed in parrot.sdk.api.__all__)
from parrot.sdk.api import __all__  # noqa: F401
