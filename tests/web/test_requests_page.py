"""Issue 38 §3 in a real browser against ``parrot serve`` on the real engine: requests made
with the real ``openai`` client (a chat with a ``json_schema`` response format, one with
tools) appear on ``/requests`` live, with their tokens, engine, format or tools, and their
detail page shows every field; the search box finds them by label; a session labelled
through the SDK is found by typing its label in the sessions page's search box; both pages
fit a 390 px phone."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from playwright.sync_api import Page, expect

from parrot.sdk import Client, Output

from .conftest import WIDTHS
from .test_browser import shoot
from .test_dashboard_polish import no_overflow

PLACE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["harbour"],
    "properties": {"harbour": {"type": "string", "maxLength": 16}},
}
TIDE_TOOL = {
    "type": "function",
    "function": {
        "name": "tide_at",
        "description": "The height of the tide at a port",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["port"],
            "properties": {"port": {"type": "string", "maxLength": 12}},
        },
    },
}
LIVE_TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def oai(dashboard_url):
    base = f"{dashboard_url}/v1"
    with openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300) as client:
        yield client


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
    yield context.new_page()
    context.close()


def row(page: Page, request_id: str):
    return page.locator(f'tr[data-request="{request_id}"]')


def cell(page: Page, request_id: str, label: str):
    return row(page, request_id).locator(f'td[data-label="{label}"]')


def fact(page: Page, name: str):
    return page.locator(f'#detail dd[data-fact="{name}"]')


def test_openai_requests_appear_live_with_their_tokens_engine_and_format_or_tools(
    page, oai, dashboard_url, artifacts
):
    url = dashboard_url
    model = oai.models.list().data[0].id
    label = f"lighthouse-{uuid.uuid4().hex[:8]}"
    page.goto(f"{url}/requests")
    page.evaluate("window.__sameDocument = true")

    structured = oai.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You name harbours of the North Sea."},
            {"role": "user", "content": "Name one harbour of Frisia, as JSON."},
        ],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "frisian_harbour", "schema": PLACE}},
        metadata={"label": label, "shift": "night"},
    )
    engines = [e["engine_id"] for e in httpx.get(f"{url}/v1/engines").json()]
    rid = structured.id
    expect(row(page, rid)).to_be_visible(timeout=LIVE_TIMEOUT_MS)  # swapped in live
    assert page.evaluate("window.__sameDocument") is True
    usage = structured.usage
    expect(cell(page, rid, "label")).to_contain_text(label)
    expect(cell(page, rid, "label")).to_contain_text("shift=night")
    expect(cell(page, rid, "status")).to_have_text("done")
    expect(cell(page, rid, "prompt tokens")).to_have_text(str(usage.prompt_tokens))
    expect(cell(page, rid, "cached tokens")).to_have_text(str(usage.prompt_tokens_details.cached_tokens))
    expect(cell(page, rid, "completion tokens")).to_have_text(str(usage.completion_tokens))
    assert cell(page, rid, "engine").inner_text() in engines
    expect(cell(page, rid, "format / tools")).to_have_text("json_schema: frisian_harbour")

    with_tools = oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "How high is the tide at Harlingen right now?"}],
        max_tokens=128,
        temperature=0,
        tools=[TIDE_TOOL],
        tool_choice="required",
        extra_headers={"X-Parrot-Label": f"{label}-tools"},
    )
    tid = with_tools.id
    expect(row(page, tid)).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    expect(cell(page, tid, "format / tools")).to_contain_text("tools: tide_at (required)")
    expect(cell(page, tid, "completion tokens")).to_have_text(str(with_tools.usage.completion_tokens))
    shoot(page, artifacts, "requests")

    # The detail of each: every field, the prompt's preview.
    cell(page, rid, "time").locator("a").click()
    page.wait_for_url(f"{url}/requests/{rid}")
    expect(page.locator("h1")).to_contain_text(rid)
    expect(fact(page, "label")).to_have_text(label)
    expect(fact(page, "tags")).to_have_text("shift=night")
    expect(fact(page, "route")).to_have_text("/v1/chat/completions")
    expect(fact(page, "model")).to_have_text(model)
    expect(fact(page, "prompt-tokens")).to_have_text(str(usage.prompt_tokens))
    expect(fact(page, "completion-tokens")).to_have_text(str(usage.completion_tokens))
    expect(fact(page, "format")).to_have_text("json_schema: frisian_harbour")
    expect(fact(page, "finish")).to_have_text(structured.choices[0].finish_reason)
    expect(fact(page, "stream")).to_have_text("no")
    assert fact(page, "engine").inner_text() in engines
    for timing in ("ttft", "duration"):
        assert fact(page, timing).inner_text().endswith(" s")
    preview = page.locator('#detail pre[data-fact="prompt"]')  # the last user message
    expect(preview).to_have_text("Name one harbour of Frisia, as JSON.")
    shoot(page, artifacts, "request")
    page.goto(f"{url}/requests/{tid}")
    expect(fact(page, "tools")).to_have_text("tide_at (tool_choice: required)")
    expect(fact(page, "finish")).to_have_text(with_tools.choices[0].finish_reason)  # tool_calls, as told
    expect(fact(page, "label")).to_have_text(f"{label}-tools")

    # The search box finds a request by its label.
    page.goto(f"{url}/requests")
    page.fill("#q", f"{label}-tools")
    page.press("#q", "Enter")
    page.wait_for_url(f"{url}/requests?q={label}-tools")
    expect(row(page, tid)).to_be_visible()
    expect(row(page, rid)).to_have_count(0)
    expect(page.locator("tr[data-request]")).to_have_count(1)


def test_a_labelled_session_is_found_by_typing_its_label(page, dashboard_url, artifacts):
    url = dashboard_url
    label = f"Tide tables {uuid.uuid4().hex[:6]}"
    one = Output(max_tokens=1, temperature=0)
    with (
        Client(url, timeout=120) as client,
        client.session(label=label, tags=["harbour-master"]) as labelled,
        client.session() as other,
    ):
        labelled.submit("Say aye: {{a}}", outputs={"a": one}).outputs["a"].get()
        page.goto(f"{url}/sessions")
        expect(page.locator(f'tr[data-session="{other.session_id}"]')).to_be_visible()
        page.fill("#q", label)
        page.press("#q", "Enter")
        page.wait_for_url("**/sessions?q=*")
        found = page.locator(f'tr[data-session="{labelled.session_id}"]')
        expect(found).to_be_visible()
        expect(found.locator('td[data-label="label"]')).to_contain_text(label)
        expect(found.locator('td[data-label="label"] .chip.tag')).to_have_text("harbour-master")
        expect(page.locator(f'tr[data-session="{other.session_id}"]')).to_have_count(0)
        expect(page.locator("#q")).to_have_value(label)
        page.wait_for_timeout(1500)  # a live update has come: it keeps the search
        expect(page.locator("tr[data-session]")).to_have_count(1)
        shoot(page, artifacts, "sessions-search")
        page.goto(f"{url}/sessions?q=HARBOUR-master")  # a tag finds it too, case aside
        expect(found).to_be_visible()
        found.locator("a").first.click()  # its page names it too
        expect(page.locator('h1 .session-label[data-label="session"]')).to_have_text(label)
        expect(page.locator("p.tags .chip.tag")).to_have_text("harbour-master")


def test_the_requests_pages_fit_a_phone(page, oai, dashboard_url):
    url = dashboard_url
    answer = oai.completions.create(
        model=oai.models.list().data[0].id,
        prompt="The keeper wrote in the log: " + "fog " * 30,
        max_tokens=2,
        extra_body={"metadata": {"label": "a label long enough to need wrapping on a phone " * 3}},
    )
    page.set_viewport_size({"width": 390, "height": 800})
    for path in ("/requests", f"/requests/{answer.id}", "/sessions?q=tide"):
        page.goto(f"{url}{path}")
        page.wait_for_load_state("load")
        tables = page.locator(".scroll > table").count()
        assert no_overflow(page) == {"page": 0, "tables": [0] * tables}, path
    page.goto(f"{url}/requests")
    label = cell(page, answer.id, "label")
    expect(label).to_be_visible()
    box = label.bounding_box()
    assert box["x"] + box["width"] <= 390
