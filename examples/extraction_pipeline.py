"""An extraction pipeline with typed outputs: support messages become tickets (JSON of a
pydantic schema), and later calls read fields of each ticket on the server.

For each message, three calls form a DAG that is submitted whole before anything waits:

- ``extract``: the ticket, constrained to the ``Ticket`` schema (``Output(schema=Ticket)``);
- ``route``: the team, one of three (``Output(choice=[...])``), from ``{{ticket.product}}``;
- ``reply``: a short answer to ``{{ticket.customer}}`` about ``{{ticket.product}}``.

The two later calls read the ticket's fields (``{{ticket.customer}}``) in their templates:
the server fills them in once the ticket is generated, with no round trip to the client.
``ticket.get()`` returns a ``Ticket`` instance; ``ticket.get_text()`` the JSON as generated.

    python examples/extraction_pipeline.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from parrot.sdk.api import Client, Input, Output, semantic_function
from parrot.sdk.run import app_main

TEAMS = ["billing", "hardware", "software"]
MESSAGES = [
    "Hi, this is Maria Lopez. My new X200 printer will not turn on since this morning. Please help!",
    "Hello, Tom Baker here: I was charged twice for my Cloud Plus subscription this month.",
]


class Ticket(BaseModel):
    model_config = ConfigDict(extra="forbid")  # no keys but these: the answer stays short

    customer: str = Field(max_length=24)
    product: str = Field(max_length=24)
    urgent: bool


@semantic_function
def extract(message: Input, ticket: Output(schema=Ticket, max_tokens=48, temperature=0)):
    """<|im_start|>system
    Extract the support ticket from the message as JSON with customer, product and urgent.<|im_end|>
    <|im_start|>user
    {{message}}<|im_end|>
    <|im_start|>assistant
    {{ticket}}"""


@semantic_function
def route(ticket: Input, team: Output(choice=TEAMS, temperature=0)):
    """<|im_start|>system
    You route support tickets to the billing, hardware or software team.<|im_end|>
    <|im_start|>user
    Which team handles a problem with {{ticket.product}}?<|im_end|>
    <|im_start|>assistant
    {{team}}"""


@semantic_function
def reply(ticket: Input, answer: Output(max_tokens=32, temperature=0)):
    """<|im_start|>system
    You write short, kind replies to customers.<|im_end|>
    <|im_start|>user
    Write a two-sentence reply to {{ticket.customer}} about their {{ticket.product}}.<|im_end|>
    <|im_start|>assistant
    {{answer}}"""


def main(server_url: str, messages: list[str] = MESSAGES) -> dict:
    with Client(server_url) as client, client.session():
        pipelines = []
        for message in messages:
            ticket = extract(message)
            pipelines.append((message, ticket, route(ticket), reply(ticket)))  # nothing waits
        results = []
        for message, ticket, team, answer in pipelines:
            results.append(
                {
                    "message": message,
                    "ticket": ticket.get().model_dump(),  # a Ticket, from its JSON
                    "ticket_json": ticket.get_text(),
                    "team": team.get(),
                    "reply": answer.get(),
                    "calls": {
                        name: msgspec.to_builtins(var.call_info())
                        for name, var in (("extract", ticket), ("route", team), ("reply", answer))
                    },
                }
            )
        return {"tickets": results}


if __name__ == "__main__":
    from durations import with_durations  # examples/ (the script's folder) is on sys.path

    app_main(with_durations(main))
