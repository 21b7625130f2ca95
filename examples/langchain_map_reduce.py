"""Map-reduce summarization in LangChain, on Parrot: every fable summarized on its own
(the maps), then one call over all the summaries (the reduce).

The LCEL chain is a ``RunnableParallel`` of map branches (``ChatPromptTemplate |
ParrotChatModel | StrOutputParser``, one per fable) followed by the reduce. It runs two
ways, each in an SDK session: step by step, as LangChain runs it (the maps run
concurrently, their summaries come back to this script, then the reduce is sent), and
compiled with ``compile_chain`` (maps and reduce submitted at once; the server runs the
maps as one group and the reduce when they are done; only the moral is read back). The
chats are rendered with the model's own template on the server, so the system message
that every call shares is one prefix on the engine.

Each way runs 3 times, alternating with the other, after a warm-up run. It prints both
morals, the median seconds of each way and their spread (and says when the spreads overlap,
so the ratio means nothing), and the server's timings of every call of the last run.

    python examples/langchain_map_reduce.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

from operator import itemgetter
from pathlib import Path

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableParallel
from timed_session import RUNS, compare, verdict  # examples/ (the script's folder) is on sys.path

from parrot.adapters.langchain import ParrotChatModel, compile_chain
from parrot.sdk import Client
from parrot.sdk.run import app_main

TEXT = Path(__file__).parent / "data" / "aesop.txt"
SYSTEM = "You write short, plain summaries of fables."


def build_chain(chat: ParrotChatModel, parts: int) -> Runnable:
    map_prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "Summarize:\n{story}")])
    summarize = map_prompt | chat | StrOutputParser()
    branches = {f"summary{i}": {"story": itemgetter(f"part{i}")} | summarize for i in range(parts)}
    maps = RunnableParallel(branches)
    lines = "\n".join(f"- {{summary{i}}}" for i in range(parts))
    ask = f"Here are summaries of some fables:\n{lines}\nWhat do they teach together? Answer in one sentence."
    reduce = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", ask)]) | chat | StrOutputParser()
    return maps | reduce


def main(server_url: str, max_parts: int | None = None, max_tokens: int = 32, runs: int = RUNS) -> dict:
    """Summarize ``examples/data/aesop.txt`` (its first ``max_parts`` fables), ``runs`` runs
    of each way (after the warm-up)."""
    parts = [p.strip() for p in TEXT.read_text().split("\n\n") if p.strip()][:max_parts]
    chat = ParrotChatModel(base_url=server_url, max_tokens=max_tokens, temperature=0)
    chain = build_chain(chat, len(parts))
    inputs = {f"part{i}": part for i, part in enumerate(parts)}
    with Client(server_url) as client:
        results = compare(client, {"step by step": chain, "compiled": compile_chain(chain)}, inputs, runs)
    print(verdict(results))
    return {"parts": len(parts), "step_by_step": results["step by step"], "compiled": results["compiled"]}


if __name__ == "__main__":
    from durations import with_durations  # examples/ (the script's folder) is on sys.path

    app_main(with_durations(main))
