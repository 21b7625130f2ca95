"""A chatbot with one long system prompt and many users, each in a session of their own,
served concurrently with the asyncio client.

The system prompt is a plain (not ``Input``) parameter of the semantic functions, so the
SDK renders it into the prompt text: it is the same constant prefix in every session, and
the server keeps it once per engine (its context is forked for every user) instead of once
per user. The second turn of each conversation depends on the first turn's answer.

    python examples/shared_prompt_chatbot.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

import asyncio

import msgspec

from parrot.sdk.api import AsyncClient, Input, Output, semantic_function
from parrot.sdk.run import app_main

SYSTEM = (
    "You are the front-desk assistant of the Harbour Town public library. "
    "The library opens from nine in the morning to six in the evening on weekdays, and from ten "
    "to four on Saturdays; it is closed on Sundays and public holidays. Anyone living in Harbour "
    "Town can get a library card for free by showing a letter with their address. A card lets "
    "you borrow up to ten books for three weeks; you can renew a loan twice, online or at the "
    "desk, unless someone else has reserved the book. Late books cost ten cents a day. The "
    "children's room is on the ground floor, the reading room with newspapers and computers on "
    "the first floor, and the local history collection, which cannot be borrowed, on the second "
    "floor. Printing costs five cents a page. Quiet is expected in the reading room. "
    "Answer in one or two short, friendly sentences, and only about the library."
)

USERS = [
    ("When are you open on Saturday?", "And on Sunday?"),
    ("How do I get a library card?", "Does it cost anything?"),
    ("How many books can I borrow?", "For how long?"),
    ("Where is the children's room?", "Is there anything on the second floor?"),
]


@semantic_function
def first_turn(system, question: Input, answer: Output(max_tokens=16, temperature=0)):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    {{question}}<|im_end|>
    <|im_start|>assistant
    {{answer}}"""


@semantic_function
def second_turn(system, question: Input, answer: Input, follow_up: Input, reply: Output(max_tokens=16)):
    """<|im_start|>system
    {{system}}<|im_end|>
    <|im_start|>user
    {{question}}<|im_end|>
    <|im_start|>assistant
    {{answer}}<|im_end|>
    <|im_start|>user
    {{follow_up}}<|im_end|>
    <|im_start|>assistant
    {{reply}}"""


async def converse(client: AsyncClient, question: str, follow_up: str) -> dict:
    """One user's conversation, in its own session (each asyncio task sees its own)."""
    async with client.session() as session:
        answer = await first_turn.asubmit(SYSTEM, question)
        reply = await second_turn.asubmit(SYSTEM, question, answer, follow_up)
        await reply.get()
        turns = [(question, answer), (follow_up, reply)]
        return {
            "session_id": session.session_id,
            "turns": [
                {
                    "user": said,
                    "assistant": await var.get(),
                    "call": msgspec.to_builtins(await var.call_info()),
                }
                for said, var in turns
            ],
        }


async def chat(server_url: str, users: int) -> dict:
    prefix_hits = 'parrot:prompt_tokens_total{source="forked"}'  # prompt tokens found on the engine
    async with AsyncClient(server_url) as client:
        before = (await client.metrics()).get(prefix_hits, 0.0)
        conversations = await asyncio.gather(
            *(converse(client, *USERS[n % len(USERS)]) for n in range(users))
        )
        after = (await client.metrics()).get(prefix_hits, 0.0)
    return {"conversations": conversations, "prompt_tokens_forked": after - before}


def main(server_url: str, users: int = len(USERS)) -> dict:
    return asyncio.run(chat(server_url, users))


if __name__ == "__main__":
    from durations import with_durations  # examples/ (the script's folder) is on sys.path

    app_main(with_durations(main))
