"""A streaming chat over a two-step chain: for each question the model first drafts notes
(the facts it will use), then writes the answer from them, and the answer is printed as it
is written.

Both calls of a turn are submitted at once: the answer call reads the notes' semantic
variable on the server, so the server starts it the moment the notes are done, and the
client never fetches the notes. The client only streams the answer
(``for piece in answer.stream()``): what the user waits for is its first token. Each turn
prints the time to the first token and to the whole answer; the JSON at the end has every
turn's text and the server's durations of its two calls (seconds from the turn's start).

    python examples/streaming_chat.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from parrot.sdk import Client, Input, Output, Session, Var, semantic_function
from parrot.sdk.run import app_main

QUESTIONS = (
    "Why is the sea salty?",
    "And why are lakes not salty?",
)


@semantic_function
def draft_notes(history: Input, question: Input, notes: Output(max_tokens=48, temperature=0)):
    """<|im_start|>system
    You are a careful assistant. Before answering, list the facts the answer needs, as short notes.<|im_end|>
    {{history}}<|im_start|>user
    {{question}}<|im_end|>
    <|im_start|>assistant
    Notes:
    {{notes}}"""


@semantic_function
def write_answer(history: Input, question: Input, notes: Input, answer: Output(max_tokens=64, temperature=0)):
    """<|im_start|>system
    You are a friendly assistant. Answer in two or three sentences, using these notes:
    {{notes}}<|im_end|>
    {{history}}<|im_start|>user
    {{question}}<|im_end|>
    <|im_start|>assistant
    {{answer}}"""


def turn_text(question: str, answer: str) -> str:
    """A finished turn, as the next turns' history (the model's chat format)."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"


def chat_turn(session: Session, history: str, question: str) -> dict:
    """One turn: submit both steps, stream the answer to the terminal as it is written."""
    start = time.perf_counter()
    notes = draft_notes(history, question)
    answer = write_answer(history, question, notes)
    print(f"\nyou: {question}\nbot: ", end="", flush=True)
    first_token_s = None
    for piece in answer.stream():
        if first_token_s is None:
            first_token_s = time.perf_counter() - start
        print(piece, end="", flush=True)
    answer_s = time.perf_counter() - start
    print(
        f"\n     (first token after {first_token_s or answer_s:.2f} s, whole answer after {answer_s:.2f} s)"
    )
    return {
        "question": question,
        "notes": notes.get(),
        "answer": answer.value,
        "first_token_s": round(first_token_s or answer_s, 3),
        "answer_s": round(answer_s, 3),
        "calls": server_durations(session, {"notes": notes, "answer": answer}),
    }


def server_durations(session: Session, outputs: dict[str, Var]) -> dict[str, dict]:
    """Each step's call as the server recorded it: its state, and when it was submitted,
    started, wrote its first token and finished, in seconds from the first submit."""
    calls = {name: session.call_info(var.call_id) for name, var in outputs.items()}
    origin = min(call.timings["submitted_at"] for call in calls.values())
    points = ("submitted_at", "started_at", "first_token_at", "finished_at")
    return {
        name: {
            "state": call.state,
            **{
                point.removesuffix("_at") + "_s": round(call.timings[point] - origin, 3)
                for point in points
                if call.timings.get(point) is not None
            },
        }
        for name, call in calls.items()
    }


def main(server_url: str, questions: Sequence[str] = QUESTIONS) -> dict:
    turns = []
    with Client(server_url) as client, client.session() as session:
        history = ""
        for question in questions:
            turn = chat_turn(session, history, question)
            history += turn_text(question, turn["answer"])
            turns.append(turn)
    return {"turns": turns}


if __name__ == "__main__":
    app_main(main)
