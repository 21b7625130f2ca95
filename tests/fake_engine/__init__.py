"""A fake engine for the serve layer's logic tests: the ``Engine`` protocol of the ServeCore
(platform/serve/engines/client.py) without a model.

Tokens are bytes (a text's tokens are its UTF-8 bytes; ``EOS`` is 256), and a generated
token is a function of the context's tokens only (a CRC of them picks a letter or a space),
so different prompts give different texts, a fork continues exactly as the context it
forked would, and a text is the same whatever else runs. Contexts fork, wait for parents
that are on their way, keep checkpoints and are freed as on the builtin engine (its
``ContextPool``); jobs beyond ``max_running`` wait, the highest priority first; stop strings
cut the text (held back from the stream while they may still match), stop token ids and
``EOS`` (``eos_after``) end a generation, ``max_tokens`` and ``max_model_len`` bound it.

Knobs for the tests: ``step_s`` (seconds per generated token), ``max_running``,
``eos_after``, :meth:`FakeEngine.fail_next` (the next requests of an operation fail with an
error), ``hang`` (every request, pings too, waits while it is set: a stopped process) and
``kv_tokens`` (the KV capacity it reports), ``cpu`` (its pings say it runs on the CPU).
``requests`` records every request it took.

It is used in-process as an ``Engine``, or served over HTTP (:class:`FakeEngineServer`: the
engine API's routes with the protocol's own request, response and error types), so a
ServeCore registers it by URL as it registers a real engine, with no seam in the ServeCore.
The real engine is the test of the engine: every feature tested here on the fake is also
tested on it (DESIGN §8).
"""

from fake_engine.engine import FakeEngine
from fake_engine.server import FakeEngineServer
from fake_engine.tokens import EOS, MODEL, next_token, tokenizer_json

__all__ = ["EOS", "MODEL", "FakeEngine", "FakeEngineServer", "next_token", "tokenizer_json"]
