"""The OpenAI engine: Fill / Generate on text contexts over any OpenAI-compatible endpoint
(OpenAI itself, vLLM, SGLang, llama.cpp, or a builtin engine's ``/v1`` routes).

:class:`~parrot.engines.openai.engine.OpenAIEngine` implements the ServeCore's ``Engine``
protocol in-process; :class:`~parrot.engines.openai.config.OpenAIEngineConfig` configures it.
"""
