"""LangChain on Parrot: ``from parrot.adapters.langchain import ParrotLLM, ParrotChatModel,
compile_chain``. See adapters/README.md."""

from parrot.adapters.langchain.chat_model import ParrotChatModel
from parrot.adapters.langchain.compiled import CompiledChain, compile_chain
from parrot.adapters.langchain.llm import ParrotLLM
from parrot.adapters.langchain.plan import CompileError
from parrot.adapters.langchain.settings import CRITERIA_KEY

__all__ = ["CRITERIA_KEY", "CompileError", "CompiledChain", "ParrotChatModel", "ParrotLLM", "compile_chain"]
