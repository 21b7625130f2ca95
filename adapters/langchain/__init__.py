"""LangChain on Parrot: ``from parrot.adapters.langchain import ParrotLLM, ParrotChatModel``.
See adapters/README.md."""

from parrot.adapters.langchain.chat_model import ParrotChatModel
from parrot.adapters.langchain.llm import ParrotLLM

__all__ = ["ParrotChatModel", "ParrotLLM"]
