"""Issue 22, the dashboard: a call's node detail shows its text growing while it is
generated, over the page's SSE live channel; and each call's time to its first token.

Over HTTP on a real app (a call waiting for an input that never comes, its output's stream
written here as the task runner writes it), then in a real browser on the real engine: a
long generation whose detail shows its text growing while the call runs."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from conftest import ServerThread
from httpx_sse import connect_sse
from playwright.sync_api import expect

from parrot.platform.serve.core import ServeCore
from parrot.platform.serve.ops.observe import VALUE_PREVIEW
from parrot.sdk import Client, Output
from parrot.web.app import create_server_app
from parrot.web.config import DashboardConfig

from .test_browser import shoot

LONG = Output(max_tokens=200, temperature=0, ignore_eos=True)
STORY = (
    "<|im_start|>user\nTell a long story about a lighthouse keeper and the ships she saw, "
    "night after night.<|im_end|>\n<|im_start|>assistant\n{{story}}"
)


@pytest.fixture(scope="module")
def in_process(engine_server):
    """A ServeCore in this process (the test writes its variables' streams)."""
    core = ServeCore()
    app = create_server_app(core, (engine_server.url,), dashboard=DashboardConfig(live_interval_s=0.2))
    with ServerThread(app) as server:
        yield server, core


def a_waiting_call(url: str) -> tuple[str, str, str]:
    """A call whose input never comes: it waits, and its output is written by the test."""
    with httpx.Client(base_url=url, timeout=30) as api:
        s = api.post("/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        never = api.post("/v1/semantic_var", json={"session_id": sid, "name": "q"}, headers=auth)
        body = {
            "session_id": sid,
            "template": "Say hi to {{q}}: {{out}}",
            "parameters": [
                {"name": "q", "var_id": never.json()["var_id"]},
                {"name": "out", "is_output": True},
            ],
        }
        call = api.post("/v1/semantic_call", json=body, headers=auth).json()
    return sid, call["call_id"], call["outputs"]["out"]


def test_the_detail_of_a_call_being_generated_shows_its_text_so_far(in_process):
    server, core = in_process
    sid, call_id, var_id = a_waiting_call(server.url)
    var = core.sessions.get(sid).vars[var_id]
    page = httpx.get(f"{server.url}/sessions/{sid}?node={call_id}").text
    assert "data-partial=" not in page and 'class="missing"' in page  # no text yet
    var.stream.append("Once upon <a> time", 4)  # as the task runner does, token by token
    page = httpx.get(f"{server.url}/sessions/{sid}?node={call_id}").text
    assert f'data-partial="{var_id}"' in page and "Once upon &lt;a&gt; time" in page
    page = httpx.get(f"{server.url}/sessions/{sid}?node={var_id}").text
    assert 'class="value partial"' in page and "Once upon &lt;a&gt; time" in page
    # Over the live channel: each update carries the text as it is then.
    live = f"/live/sessions/{sid}?node={call_id}"
    with httpx.Client(base_url=server.url, timeout=30) as client, connect_sse(client, "GET", live) as source:
        events = source.iter_sse()
        assert "Once upon &lt;a&gt; time</mark>" in next(events).data
        var.stream.append(", there was", 2)
        assert "Once upon &lt;a&gt; time, there was</mark>" in next(events).data


def test_only_the_latest_text_of_a_long_generation_is_sent(in_process):
    server, core = in_process
    sid, call_id, var_id = a_waiting_call(server.url)
    var = core.sessions.get(sid).vars[var_id]
    var.stream.append("a" * VALUE_PREVIEW, 100)
    var.stream.append("THE END", 2)
    page = httpx.get(f"{server.url}/sessions/{sid}?node={call_id}").text
    shown = page.split(f'data-partial="{var_id}"')[1].split(">", 1)[1].split("</mark>")[0]
    assert shown.endswith("THE END") and shown.startswith("…") and len(shown) == VALUE_PREVIEW + 1


def test_a_running_call_shows_its_text_growing_live_in_the_browser(browser, dashboard_url, artifacts):
    """The real engine, a long generation: the node detail shows at least two different
    non-empty texts while the call is running, then its value and its time to first token."""
    url = dashboard_url
    with Client(url, timeout=180) as client, client.session() as session:
        call = session.submit(STORY, outputs={"story": LONG})
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{url}/sessions/{session.session_id}?node={call.call_id}")
        page.evaluate("window.__sameDocument = true")
        seen: list[str] = []
        text = page.locator("#detail mark.partial")
        deadline = time.monotonic() + 150
        while len(set(seen)) < 2 and time.monotonic() < deadline:
            found = page.evaluate(
                """() => {
                    const m = document.querySelector('#detail mark.partial');
                    const chip = document.querySelector('#detail h2 .chip');
                    return m && chip ? [chip.textContent, m.textContent] : null;
                }"""
            )
            if found and found[0] == "running" and found[1] and (not seen or found[1] != seen[-1]):
                seen.append(found[1])
                if len(seen) == 1:
                    shoot(page, artifacts, "session-generating")
            page.wait_for_timeout(150)
        assert len(set(seen)) >= 2, seen
        assert seen[-1].startswith(seen[0]) and len(seen[-1]) > len(seen[0])  # it grows
        story = call.outputs["story"].get()
        expect(page.locator("#detail h2 .chip")).to_have_text("done", timeout=30_000)
        expect(text).to_have_count(0)
        expect(page.locator("#detail pre.template mark.output")).to_contain_text(story[:40])
        expect(page.locator('#detail dd[data-fact="first-token"]')).to_have_text(re.compile(r"^\d+\.\d\d s$"))
        assert page.evaluate("window.__sameDocument") is True  # all of it live, no reload
        context.close()
