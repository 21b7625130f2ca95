"""A chatbot with one long system prompt shared by many users (the paper's GPTs-style
workload): every user asks one question at the same time, each in a session of their own.

Parrot: the system prompt is a plain (text) parameter of the semantic function, so it is
the same constant prefix in every session and the server holds it once per engine; each
user's call is one request (``client.call``).
Baseline: the same turns as chat messages to the engine's ``/v1/chat/completions`` (its
prefix cache on). Measured: output tokens per second over all users, and the mean
latency of a user.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from benchmarks.apps.chat import answer, messages
from benchmarks.apps.clients import WAIT_S, ParrotClient, RequestClient, fixed_output
from benchmarks.apps.text import Document
from benchmarks.apps.workload import Metric, Metrics, Size

SYSTEM = (
    "Reading room desk {tag}. You are the librarian of a reading room that keeps The Devil's "
    "Dictionary by Ambrose Bierce. Answer the visitor's question about a word in one or two "
    "sentences, in the spirit of the book. These are the entries on the desk today:\n\n{entries}"
)
PREAMBLE_TOKENS = 60  # SYSTEM without its entries, about: the passage makes up the rest
QUESTION = "What does the dictionary say about the word {word}?"


@dataclass(frozen=True)
class ChatbotConfig:
    users: int
    system_tokens: int
    output_tokens: int
    engines: int = 1
    prompts: int = 1  # distinct system prompts (the users spread over them at random)

    @property
    def label(self) -> str:
        system = f"{self.prompts} x {self.system_tokens}" if self.prompts > 1 else f"{self.system_tokens}"
        return f"{self.users} users, {system}-tok system prompt, {self.output_tokens} out"


@dataclass(frozen=True)
class ChatbotScenario:
    turns: list[tuple[str, str]]  # (system prompt, question) of each user
    output_tokens: int


async def timed(coro) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


def _metrics(latencies: list[float], s: ChatbotScenario) -> Metrics:
    """All users start together: the last answer came after the longest latency."""
    tokens = len(s.turns) * s.output_tokens
    return {"tok_per_s": tokens / max(latencies), "latency_s": sum(latencies) / len(latencies)}


class Chatbot:
    name = "chatbot"
    title = "Chatbot with a long shared system prompt"
    about = (
        "Many users, each in a session of their own, ask one question at the same time "
        "behind one long system prompt (passages of the book). Output tokens per second "
        "over all users, and the mean latency of a user."
    )
    metrics = (Metric("tok_per_s", "tok/s", higher_is_better=True), Metric("latency_s", "user s"))

    def configs(self, size: Size) -> list[ChatbotConfig]:
        return {
            "smoke": [ChatbotConfig(2, 64, 4)],
            "quick": [ChatbotConfig(8, 1024, 16)],
            "full": [ChatbotConfig(32, 1536, 32), ChatbotConfig(64, 2048, 32)],
        }[size]

    def fleet_configs(self, size: Size) -> list[ChatbotConfig]:
        """Issue 39's shared prompts: 16 users over 4 distinct ~1,000-word system prompts."""
        return {
            "smoke": [ChatbotConfig(4, 64, 4, prompts=2)],
            "quick": [ChatbotConfig(16, 640, 16, prompts=4)],
            "full": [ChatbotConfig(16, 1300, 32, prompts=4)],
        }[size]

    def scenario(self, config: ChatbotConfig, doc: Document, rng: random.Random, tag: str) -> ChatbotScenario:
        entries = doc.passages(rng, config.prompts, config.system_tokens - PREAMBLE_TOKENS)
        systems = [SYSTEM.format(tag=f"{tag}-{n}", entries=e) for n, e in enumerate(entries)]
        questions = [QUESTION.format(word=w) for w in doc.words(rng, config.users)]
        turns = [(rng.choice(systems) if config.prompts > 1 else systems[0], q) for q in questions]
        return ChatbotScenario(turns, config.output_tokens)

    async def run_parrot(self, parrot: ParrotClient, s: ChatbotScenario) -> Metrics:
        async def user(system: str, question: str) -> float:
            start = time.perf_counter()
            # One request, as the baseline's: the call's session made and deleted by it.
            await parrot.call(answer, system, question, reply=fixed_output(s.output_tokens), timeout=WAIT_S)
            return time.perf_counter() - start

        return _metrics(await asyncio.gather(*(user(*turn) for turn in s.turns)), s)

    async def run_requests(self, client: RequestClient, s: ChatbotScenario) -> Metrics:
        latencies = await asyncio.gather(
            *(timed(client.chat(messages(system, q), s.output_tokens)) for system, q in s.turns)
        )
        return _metrics(latencies, s)


WORKLOAD = Chatbot()
