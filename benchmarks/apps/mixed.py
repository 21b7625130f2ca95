"""Mixed: streaming chat users beside map-reduce applications, on one engine and on two.

The chat users are latency-critical (a person reads the stream), the map-reduce
applications throughput-bound (on Parrot their final ``get`` says so:
``criteria="throughput"``). Everything starts together: every chat user asks a few
questions one after another (each once the previous answer has streamed to its end)
while the applications run. Parrot: the applications with the SDK's semantic functions,
the chat users with its ``stream_chat`` (Parrot's OpenAI front, streamed). Baseline: the
applications and the chat users on the engines' own ``/v1`` (round-robin over two
engines). Measured: the chat users' time to first token and time per output token after
it, and the whole answer (request to last token; means over all their answers), and the
mean completion time of the applications.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from benchmarks.apps.chat import messages
from benchmarks.apps.chatbot import QUESTION
from benchmarks.apps.clients import ParrotClient, RequestClient, Streamed, sampling, timed_stream
from benchmarks.apps.map_reduce import (
    MapReduceConfig,
    MapReduceScenario,
    map_reduce_scenario,
    parrot_app,
    requests_app,
)
from benchmarks.apps.text import Document
from benchmarks.apps.workload import Metric, Metrics, Size

CHAT_SYSTEM = (
    "Reading room desk {tag}. You are the librarian of a reading room that keeps The Devil's "
    "Dictionary by Ambrose Bierce. Answer the visitor's question about a word in a few "
    "sentences, in the spirit of the book."
)


@dataclass(frozen=True)
class MixedConfig:
    chat_users: int
    chat_turns: int
    chat_tokens: int
    apps: int
    maps: MapReduceConfig
    engines: int = 1

    @property
    def label(self) -> str:
        return (
            f"{self.engines} engine(s): {self.chat_users} chat users x {self.chat_turns} turns "
            f"({self.chat_tokens} out) + {self.apps} x map-reduce "
            f"{self.maps.maps} x {self.maps.chunk_tokens} tok"
        )


@dataclass(frozen=True)
class MixedScenario:
    system: str
    chats: list[list[str]]  # the questions of every chat user
    chat_tokens: int
    apps: list[MapReduceScenario]


def _metrics(chats: list[list[Streamed]], app_seconds: list[float]) -> Metrics:
    answers = [a for user in chats for a in user]
    return {
        "tpot_s": sum(a.tpot_s for a in answers) / len(answers),
        "ttft_s": sum(a.ttft_s for a in answers) / len(answers),
        "answer_s": sum(a.total_s for a in answers) / len(answers),
        "app_s": sum(app_seconds) / len(app_seconds),
    }


async def _chat_user(client: RequestClient, s: MixedScenario, questions: list[str]) -> list[Streamed]:
    return [await client.chat_stream(messages(s.system, q), s.chat_tokens) for q in questions]


async def _parrot_chat_user(parrot: ParrotClient, s: MixedScenario, questions: list[str]) -> list[Streamed]:
    answers = []
    for question in questions:
        deltas = parrot.stream_chat(messages(s.system, question), **sampling(s.chat_tokens))
        answers.append(await timed_stream((d.text async for d in deltas), s.chat_tokens))
    return answers


class Mixed:
    name = "mixed"
    title = "Mixed: streaming chat beside map-reduce"
    about = (
        "Streaming chat users (a few questions each, one after another) beside map-reduce "
        "applications that start at the same moment, on one engine and on two (one core "
        "each). Chat: mean time per output token and to the first token; map-reduce: mean "
        "completion time of an application. On Parrot the chat users go through its OpenAI "
        "front, the applications through the SDK."
    )
    metrics = (
        Metric("tpot_s", "chat ms/token", scale=1000),
        Metric("ttft_s", "chat TTFT s"),
        Metric("answer_s", "chat answer s"),
        Metric("app_s", "map-reduce s"),
    )

    def configs(self, size: Size) -> list[MixedConfig]:
        return {
            "smoke": [MixedConfig(1, 1, 4, 1, MapReduceConfig(2, 48, 4))],
            "quick": [
                MixedConfig(4, 2, 32, 1, MapReduceConfig(8, 256, 16)),
                MixedConfig(4, 2, 32, 1, MapReduceConfig(8, 256, 16), engines=2),
            ],
            "full": [
                MixedConfig(8, 3, 64, 2, MapReduceConfig(16, 256, 32), engines=1),
                MixedConfig(8, 3, 64, 2, MapReduceConfig(16, 256, 32), engines=2),
            ],
        }[size]

    def scenario(self, config: MixedConfig, doc: Document, rng: random.Random, tag: str) -> MixedScenario:
        words = doc.words(rng, config.chat_users * config.chat_turns)
        questions = [QUESTION.format(word=w) for w in words]
        chats = [questions[n :: config.chat_users] for n in range(config.chat_users)]
        apps = [map_reduce_scenario(config.maps, doc, rng, tag) for _ in range(config.apps)]
        return MixedScenario(CHAT_SYSTEM.format(tag=tag), chats, config.chat_tokens, apps)

    async def run_parrot(self, parrot: ParrotClient, s: MixedScenario) -> Metrics:
        apps = asyncio.gather(*(parrot_app(parrot, app, "throughput") for app in s.apps))
        chats = asyncio.gather(*(_parrot_chat_user(parrot, s, questions) for questions in s.chats))
        app_seconds, streamed = await asyncio.gather(apps, chats)
        return _metrics(streamed, app_seconds)

    async def run_requests(self, client: RequestClient, s: MixedScenario) -> Metrics:
        apps = asyncio.gather(*(requests_app(client, app) for app in s.apps))
        chats = asyncio.gather(*(_chat_user(client, s, questions) for questions in s.chats))
        app_seconds, streamed = await asyncio.gather(apps, chats)
        return _metrics(streamed, app_seconds)


WORKLOAD = Mixed()
