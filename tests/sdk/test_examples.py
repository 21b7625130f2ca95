"""The example applications run against a real ``parrot serve``: every output is there, and
the server ran each call only after the calls it depends on had finished."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import re
import subprocess
import sys
from types import ModuleType

import pytest
from conftest import REPO_ROOT

from parrot.sdk import run as sdk_run

EXAMPLES = REPO_ROOT / "examples"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"parrot_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_done(*calls: dict) -> None:
    for call in calls:
        assert call["state"] == "done" and call["error"] is None, call


def assert_after(consumer: dict, *producers: dict) -> None:
    """``consumer`` started only once every producer had finished (server clock)."""
    last = max(p["timings"]["finished_at"] for p in producers)
    assert consumer["timings"]["started_at"] >= last, (consumer, producers)


def test_chain_summarization(parrot_url):
    result = example("chain_summarization").main(parrot_url, max_parts=3)
    steps = result["steps"]
    assert result["parts"] == 3 and len(steps) == 3
    assert all(step["summary"].strip() for step in steps)
    assert result["summary"] == steps[-1]["summary"]
    assert_done(*(step["call"] for step in steps))
    for before, after in itertools.pairwise(steps):
        assert_after(after["call"], before["call"])


def test_map_reduce_summarization(parrot_url):
    result = example("map_reduce_summarization").main(parrot_url, max_parts=4)
    maps = [m["call"] for m in result["maps"]]
    assert len(maps) == 4 and all(m["summary"].strip() for m in result["maps"])
    assert result["moral"].strip()
    assert_done(result["reduce"], *maps)
    assert_after(result["reduce"], *maps)
    # The maps do not wait for each other: each started before any map had finished.
    first_finish = min(m["timings"]["finished_at"] for m in maps)
    assert all(m["timings"]["started_at"] <= first_finish for m in maps)


def test_code_review_agents(parrot_url):
    result = example("code_review_agents").main(parrot_url)
    assert set(result) == {"coder", "tester", "reviewer"}
    assert all(agent["output"].strip() for agent in result.values())
    coder, tester, reviewer = (result[k]["call"] for k in ("coder", "tester", "reviewer"))
    assert_done(coder, tester, reviewer)
    assert_after(tester, coder)
    assert_after(reviewer, coder, tester)


def test_shared_prompt_chatbot(parrot_url):
    result = example("shared_prompt_chatbot").main(parrot_url, users=3)
    conversations = result["conversations"]
    assert len({c["session_id"] for c in conversations}) == 3
    for conversation in conversations:
        first, second = conversation["turns"]
        assert first["assistant"].strip()
        # The follow-up reply exists and is done; the tiny model may end that turn at once
        # (its first token the end of turn), which batching noise decides on some runs.
        assert isinstance(second["assistant"], str)
        assert_done(first["call"], second["call"])
        assert_after(second["call"], first["call"])
    # The system prompt was found already on the engine for most of the six calls.
    assert result["prompt_tokens_forked"] >= 3 * 50


def test_extraction_pipeline(parrot_url):
    """Typed tickets; the route and reply calls read the ticket's fields on the server, so
    they started only once the ticket was done, and were submitted before it was."""
    result = example("extraction_pipeline").main(parrot_url)
    tickets = result["tickets"]
    assert len(tickets) == 2
    for ticket in tickets:
        assert set(ticket["ticket"]) == {"customer", "product", "urgent"}
        assert json.loads(ticket["ticket_json"]) == ticket["ticket"]
        assert ticket["team"] in ("billing", "hardware", "software")
        assert isinstance(ticket["reply"], str)
        calls = ticket["calls"]
        assert_done(*calls.values())
        assert_after(calls["route"], calls["extract"])
        assert_after(calls["reply"], calls["extract"])
        assert calls["reply"]["timings"]["submitted_at"] <= calls["extract"]["timings"]["finished_at"]


def test_tool_agent(parrot_url):
    """The first answer calls a tool with arguments of its schema; the tool's result goes
    back as a ``tool`` message and the model answers again."""
    result = example("tool_agent").main(parrot_url, max_turns=3)
    assert result["tool_calls"] and result["turns"] >= 2
    first = result["tool_calls"][0]
    assert first["name"] in ("get_weather", "add")
    if first["name"] == "add":
        assert all(isinstance(first["args"][k], int) for k in ("a", "b"))
    else:
        assert isinstance(first["args"]["city"], str)
    roles = [m["role"] for m in result["messages"]]
    assert roles[:4] == ["system", "user", "assistant", "tool"]
    assert result["messages"][2]["tool_calls"][0]["id"] == result["messages"][3]["tool_call_id"]


def test_streaming_chat(parrot_url, capsys):
    """Each answer is printed as it streams, with its time to the first token; its call was
    on the server before the notes existed and started once they were done."""
    result = example("streaming_chat").main(parrot_url)
    printed = capsys.readouterr().out
    turns = result["turns"]
    assert [t["question"] for t in turns] == list(example("streaming_chat").QUESTIONS)
    assert turns[0]["answer"].strip() and turns[0]["notes"].strip()
    assert printed.count("first token after") == len(turns)
    for turn in turns:
        assert f"bot: {turn['answer']}\n" in printed
        assert 0 < turn["first_token_s"] <= turn["answer_s"]
        notes, answer = turn["calls"]["notes"], turn["calls"]["answer"]
        assert notes["state"] == answer["state"] == "done"
        assert answer["submitted_s"] <= notes["finished_s"] <= answer["started_s"]
        assert answer["started_s"] <= answer["finished_s"]


@pytest.mark.spawns
@pytest.mark.parametrize(
    ("name", "about"),
    [("extraction_pipeline", "typed outputs"), ("tool_agent", "tools"), ("streaming_chat", "stream()")],
)
def test_typed_examples_run_as_scripts(name, about):
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--server" in out.stdout and about in out.stdout


def test_parrot_run_points_an_app_at_the_server(parrot_url, tmp_path):
    """``parrot run APP --server URL ARGS``: the app's clients talk to URL, it gets ARGS."""
    app = tmp_path / "app.py"
    app.write_text(
        "import json, sys\n"
        "from parrot.sdk.api import Client\n"
        "with Client() as client:\n"
        "    print(json.dumps({'argv': sys.argv[1:], 'url': client.config.base_url,"
        " 'status': client.healthz().status}))\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "parrot.sdk.run",
            str(app),
            "--server",
            parrot_url,
            "--n",
            "3",
            "--",
            "--server",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout) == {"argv": ["--n", "3", "--server"], "url": parrot_url, "status": "ok"}
    # The same command as a subcommand of ``parrot``.
    parser = argparse.ArgumentParser(prog="parrot")
    sdk_run.add_parser(parser.add_subparsers())
    args = parser.parse_args(["run", str(app), "--server", parrot_url])
    assert args.run is sdk_run.run and args.app == str(app)


def python_blocks(path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_documented_snippets_run(parrot_url, capsys):
    """The main README's Python snippets (the OpenAI client and the SDK quick start) and the
    SDK README's first example, as written but for the server's address."""
    readme = python_blocks(REPO_ROOT / "README.md")
    assert any("semantic_function" in code for code in readme)
    snippets = [*readme, python_blocks(REPO_ROOT / "sdk" / "README.md")[1]]
    for code in snippets:
        assert "http://127.0.0.1:9000" in code
        exec(compile(code.replace("http://127.0.0.1:9000", parrot_url), "snippet", "exec"), {})
        printed = capsys.readouterr().out
        assert printed.strip(), code
