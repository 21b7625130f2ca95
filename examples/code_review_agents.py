"""Three agents on one task: a coder writes a function, a tester writes tests for it, and a
reviewer reads both and gives a verdict.

The tester depends on the coder's output and the reviewer on both: a small DAG that the
server runs by itself once the three calls are submitted.

    python examples/code_review_agents.py --server http://127.0.0.1:9000
"""

from __future__ import annotations

import msgspec

from parrot.sdk.api import Client, Input, Output, semantic_function
from parrot.sdk.run import app_main

TASK = "Write a Python function is_palindrome(s) that tells whether a string reads the same backwards."


@semantic_function
def write_code(task: Input, code: Output(max_tokens=32, temperature=0)):
    """<|im_start|>system
    You are a careful Python programmer. Answer with code only.<|im_end|>
    <|im_start|>user
    {{task}}<|im_end|>
    <|im_start|>assistant
    {{code}}"""


@semantic_function
def write_tests(task: Input, code: Input, tests: Output(max_tokens=32, temperature=0)):
    """<|im_start|>system
    You write pytest tests. Answer with code only.<|im_end|>
    <|im_start|>user
    Task: {{task}}
    Code:
    {{code}}
    Write tests for this code.<|im_end|>
    <|im_start|>assistant
    {{tests}}"""


@semantic_function
def review(code: Input, tests: Input, verdict: Output(max_tokens=24, temperature=0)):
    """<|im_start|>system
    You review code. Be brief.<|im_end|>
    <|im_start|>user
    Code:
    {{code}}
    Tests:
    {{tests}}
    Is the code correct and are the tests enough? Answer in one sentence.<|im_end|>
    <|im_start|>assistant
    {{verdict}}"""


def main(server_url: str, task: str = TASK) -> dict:
    with Client(server_url) as client, client.session() as session:
        brief = session.var("task", task)  # one variable that two agents read
        code = write_code(brief)
        tests = write_tests(brief, code)
        verdict = review(code, tests)
        verdict.get()  # the only wait
        agents = {"coder": code, "tester": tests, "reviewer": verdict}
        return {
            name: {"output": var.get(), "call": msgspec.to_builtins(var.call_info())}
            for name, var in agents.items()
        }


if __name__ == "__main__":
    from durations import with_durations  # examples/ (the script's folder) is on sys.path

    app_main(with_durations(main))
