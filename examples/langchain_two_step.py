"""A two-step LangChain chain on Parrot: a name for a business, then a slogan written
from that name.

The same LCEL chain (``PromptTemplate | ParrotLLM | StrOutputParser``, twice) runs two
ways, each in an SDK session so its calls can be looked at afterwards:

- step by step, as LangChain runs it: the name is generated and read back, then the
  slogan call is sent;
- compiled with ``compile_chain``: both calls are submitted at once, the slogan call
  reading the name's semantic variable on the server, and only the slogan is read back.

Each way runs 3 times, alternating with the other, after a warm-up run. It prints both
outputs, the median seconds of each way and their spread (and says when the spreads overlap,
so the ratio means nothing), and the server's timings of every call of the last run
(the compiled slogan call was submitted before the name existed).

    python examples/langchain_two_step.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import Runnable
from timed_session import RUNS, compare, verdict  # examples/ (the script's folder) is on sys.path

from parrot.adapters.langchain import ParrotLLM, compile_chain
from parrot.sdk import Client
from parrot.sdk.run import app_main

NAME = "<|im_start|>user\nGive one name for a {thing}. Only the name.<|im_end|>\n<|im_start|>assistant\n"
SLOGAN = "<|im_start|>user\nWrite a one-line slogan for {name}.<|im_end|>\n<|im_start|>assistant\n"


def build_chain(llm: ParrotLLM) -> Runnable:
    name = PromptTemplate.from_template(NAME) | llm | StrOutputParser()
    slogan = PromptTemplate.from_template(SLOGAN) | llm | StrOutputParser()
    return {"name": name} | slogan


def main(server_url: str, thing: str = "seaside bakery", max_tokens: int = 24, runs: int = RUNS) -> dict:
    """``runs`` runs of each way (after the warm-up)."""
    llm = ParrotLLM(base_url=server_url, max_tokens=max_tokens, temperature=0)
    chain = build_chain(llm)
    ways = {"step by step": chain, "compiled": compile_chain(chain)}
    with Client(server_url) as client:
        results = compare(client, ways, {"thing": thing}, runs)
    print(verdict(results))
    return {"step_by_step": results["step by step"], "compiled": results["compiled"]}


if __name__ == "__main__":
    from durations import with_durations  # examples/ (the script's folder) is on sys.path

    app_main(with_durations(main))
