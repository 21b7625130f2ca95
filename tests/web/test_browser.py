"""The dashboard in a real browser (Debian's chromium, Playwright) against ``parrot serve``:
sign in, register a second builtin engine through the form, watch a map-reduce session's
DAG go from waiting to done live, open a node, see two sessions share a prefix, remove the
engine; bad form input; escaping; and the pages with JavaScript off. Every page is
screenshotted at 1280 and 390 px wide into the artifacts folder."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from parrot.sdk import Client, Output

from .conftest import ADMIN, WIDTHS

SYSTEM = (
    "<|im_start|>system\nYou summarize the logs of a lighthouse for the harbour master. "
    "Answer in a few words.<|im_end|>\n"
)
MAP = SYSTEM + (
    "<|im_start|>user\nSummarize part PART of this log: {{doc}}<|im_end|>\n<|im_start|>assistant\n{{summary}}"
)
REDUCE = "<|im_start|>user\nJoin these: {{a}} / {{b}} / {{c}}<|im_end|>\n<|im_start|>assistant\n{{moral}}"
SHORT = Output(max_tokens=3, temperature=0)
LIVE_TIMEOUT_MS = 90_000


def shoot(page: Page, artifacts, name: str) -> None:
    """The page as it is, full length, at each width."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(artifacts / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": WIDTHS[0], "height": 900})


def registered(url: str) -> list[tuple]:
    """The engines registered (not their load, which changes on every ping)."""
    return [(e["engine_id"], e["kind"], e["url"], e["model"]) for e in httpx.get(f"{url}/v1/engines").json()]


def sign_in(page: Page, url: str, then: str = "/engines") -> None:
    page.goto(f"{url}/login?next={then}")
    page.fill("#f-token", ADMIN)
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{url}{then}")


def test_operator_registers_an_engine_and_watches_a_map_reduce_live(
    browser, dashboard_url, second_engine, artifacts
):
    url = dashboard_url
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
    page = context.new_page()
    page.goto(f"{url}/login")
    shoot(page, artifacts, "login")
    sign_in(page, url)

    # Register the second builtin engine through the form; it shows up healthy.
    page.check("input[name=kind][value=builtin]")
    page.fill("#f-url", second_engine)
    page.click("form.register button[type=submit]")
    page.wait_for_url(f"{url}/engines")
    row = page.locator(f'tr[data-url="{second_engine}"]')
    expect(row).to_have_attribute("data-health", "up")
    engine_id = row.get_attribute("data-engine")
    expect(page.locator("p.notice")).to_have_text(
        f"Registered {engine_id}: {row.get_attribute('data-model')} at {second_engine}."
    )
    shoot(page, artifacts, "engines-registered")
    page.reload()  # the notice is shown once
    expect(page.locator("p.notice")).to_have_count(0)
    assert {e["url"] for e in httpx.get(f"{url}/v1/engines").json()} >= {second_engine}

    with Client(url, timeout=120) as client:
        session = client.session()
        other = client.session()
        try:
            # A map-reduce whose maps wait for a document the client sets later.
            doc = session.var("doc")
            maps = [
                session.submit(MAP.replace("PART", str(i)), inputs={"doc": doc}, outputs={"summary": SHORT})
                for i in range(3)
            ]
            parts = {k: m.outputs["summary"] for k, m in zip("abc", maps, strict=True)}
            reduce = session.submit(REDUCE, inputs=parts, outputs={"moral": SHORT})
            page.goto(f"{url}/sessions/{session.session_id}")
            expect(page.locator("svg.dag g.call")).to_have_count(4)
            expect(page.locator('svg.dag g.call[data-state="waiting"]')).to_have_count(4)
            expect(page.locator("svg.dag .mark-group")).to_have_count(3)
            page.evaluate("window.__sameDocument = true")
            shoot(page, artifacts, "session-waiting")

            doc.set("Night 12: fog from the east, the lamp turned all night, one ship passed.")
            page.wait_for_function(
                "document.querySelectorAll('svg.dag g.call[data-state=\"done\"]').length === 4",
                timeout=LIVE_TIMEOUT_MS,
            )
            assert page.evaluate("window.__sameDocument") is True  # updated live, not reloaded
            assert reduce.outputs["moral"].get()

            # Open a map: its template with the document filled in, its engine and timings.
            page.click(f'svg.dag g.call[data-node="{maps[0].call_id}"]')
            page.wait_for_url(f"**/sessions/{session.session_id}?node={maps[0].call_id}*")
            template = page.locator("#detail pre.template")
            expect(template).to_contain_text("Night 12: fog from the east")
            expect(template).to_contain_text("Summarize part 0 of this log")
            expect(page.locator("#detail")).to_contain_text("max_tokens=3")
            expect(page.locator("svg.gantt rect.run")).to_have_count(4)
            shoot(page, artifacts, "session")

            # Another session with the same system prompt: the contexts page shows the prefix
            # they share.
            hi = other.submit(
                SYSTEM + "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n{{hi}}",
                outputs={"hi": SHORT},
            ).outputs["hi"]
            hi.get()
            page.goto(f"{url}/contexts")
            both = (
                f'g.ctx-node.shared[data-sessions~="{session.session_id}"]'
                f'[data-sessions~="{other.session_id}"]'
            )
            expect(page.locator(both).first).to_be_visible()
            shoot(page, artifacts, "contexts")

            page.goto(f"{url}/sessions")
            expect(page.locator(f'tr[data-session="{session.session_id}"]')).to_be_visible()
            shoot(page, artifacts, "sessions")
            page.goto(f"{url}/")
            expect(page.locator("tr[data-engine]")).to_have_count(2)
            shoot(page, artifacts, "overview")
            page.goto(f"{url}/engines")
            shoot(page, artifacts, "engines")
        finally:
            session.delete()
            other.delete()

    # Remove the second engine through its form, after its confirmation page.
    page.goto(f"{url}/engines")
    page.locator(f'tr[data-engine="{engine_id}"] a.danger').click()
    page.wait_for_url(f"{url}/engines/{engine_id}/remove")
    expect(page.locator("h1")).to_have_text(f"Remove {engine_id}?")
    expect(page.locator("p.warning")).to_have_count(0)  # not the only engine
    shoot(page, artifacts, "engine-remove")
    page.click("form.confirm-remove button[type=submit]")
    page.wait_for_url(f"{url}/engines")
    expect(page.locator("p.notice")).to_have_text(f"Removed {engine_id}.")
    expect(page.locator(f'tr[data-engine="{engine_id}"]')).to_have_count(0)
    assert second_engine not in {e["url"] for e in httpx.get(f"{url}/v1/engines").json()}
    context.close()


def test_invalid_form_input_is_shown_next_to_the_field(browser, dashboard_url, artifacts):
    url = dashboard_url
    before = registered(url)
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, url)
    page.fill("#f-url", "localhost:9001")  # no scheme
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/engines")) as answer:
        page.click("form.register button[type=submit]")
    assert answer.value.status == 422
    expect(page.locator("#f-url + p.field-error")).to_contain_text("a URL such as")
    expect(page.locator("#f-url")).to_have_attribute("aria-invalid", "true")
    shoot(page, artifacts, "engines-invalid")
    page.check("input[name=kind][value=openai]")
    page.fill("#f-base", "http://127.0.0.1:9/v1")
    page.fill("#f-key", "sk-never-shown")
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/engines")) as answer:
        page.click("form.register button[type=submit]")
    assert answer.value.status == 422
    expect(page.locator("#f-model + p.field-error")).to_be_visible()
    assert "sk-never-shown" not in page.content()
    assert registered(url) == before
    context.close()


def test_user_text_is_escaped_and_pages_work_without_javascript(browser, dashboard_url, artifacts):
    url = dashboard_url
    script = "<script>window.__xss = 1</script><b>bold</b>"
    with Client(url, timeout=120) as client, client.session() as session:
        evil = session.var('<img src=x onerror="window.__xss = 2">', script)
        call = session.submit("Repeat {{x}}: {{y}}", inputs={"x": evil}, outputs={"y": SHORT})
        call.outputs["y"].get()
        page_url = f"{url}/sessions/{session.session_id}"

        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{page_url}?node={call.call_id}")
        expect(page.locator("#detail pre.template")).to_contain_text(script)
        assert page.locator("#detail pre.template b, #detail pre.template script").count() == 0
        page.goto(f"{page_url}?node={evil.var_id}")
        expect(page.locator("#detail pre.value")).to_contain_text(script)
        expect(page.locator("#detail h2")).to_contain_text('<img src=x onerror="window.__xss = 2">')
        page.wait_for_timeout(1500)  # a live update has come and been swapped in
        assert page.evaluate("window.__xss") is None
        assert "&lt;script&gt;window.__xss" in httpx.get(f"{page_url}?node={call.call_id}").text
        context.close()

        # JavaScript off: every page still shows its data (rendered by the server).
        context = browser.new_context(java_script_enabled=False)
        page = context.new_page()
        page.goto(f"{page_url}?node={call.call_id}")
        expect(page.locator('svg.dag g.call[data-state="done"]')).to_have_count(1)
        expect(page.locator("#detail pre.template")).to_contain_text("Repeat")
        shoot(page, artifacts, "session-no-js")
        page.goto(f"{url}/sessions")
        expect(page.locator(f'tr[data-session="{session.session_id}"]')).to_be_visible()
        page.goto(f"{url}/engines")
        expect(page.locator('tr[data-engine][data-health="up"]')).to_have_count(1)
        page.goto(f"{url}/")
        expect(page.locator('[data-stat="sessions"]')).not_to_have_text("0")
        page.goto(f"{url}/contexts")
        expect(page.locator("section.engine-tree")).to_have_count(1)
        context.close()


def test_a_typed_variable_shows_its_format_and_the_fields_read(browser, dashboard_url, artifacts):
    """Issue 21: a typed variable's node detail shows its format; a call reading a field of it
    shows the field's value filled in its template, and its output's format."""
    url = dashboard_url
    schema = {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}}}}
    with httpx.Client(base_url=url, timeout=120) as api:
        s = api.post("/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        plan = api.post(
            "/v1/semantic_var",
            json={
                "session_id": sid,
                "name": "plan",
                "value": '{"steps": ["boil <water>", "add tea"]}',
                "format": {"json_schema": schema},
            },
            headers=auth,
        ).json()["var_id"]
        body = {
            "session_id": sid,
            "template": "First: {{plan.steps[0]}}. Good? {{ok}}",
            "parameters": [
                {"name": "plan", "var_id": plan},
                {"name": "ok", "is_output": True, "format": {"choice": ["yes", "no"]}},
            ],
        }
        call = api.post("/v1/semantic_call", json=body, headers=auth).json()
        ok = api.get(f"/v1/semantic_var/{call['outputs']['ok']}", params={"session_id": sid}, headers=auth)
        assert ok.json()["value"] in ("yes", "no"), ok.text

    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{url}/sessions/{sid}?node={plan}")
    expect(page.locator("#detail code.format-kind")).to_have_text("json_schema")
    expect(page.locator("#detail pre.format")).to_contain_text('"items": {')
    shoot(page, artifacts, "typed-variable")
    page.goto(f"{url}/sessions/{sid}?node={call['call_id']}")
    field = page.locator('#detail pre.template mark.input[title="input plan.steps[0]"]')
    expect(field).to_have_text("boil <water>")  # the field's value, unquoted and escaped
    expect(page.locator('#detail pre.format[data-output="ok"]')).to_contain_text('"choice": [')
    expect(page.locator("#detail p.format-kind code")).to_have_text("choice")
    shoot(page, artifacts, "typed-call")
    page.goto(f"{url}/sessions/{sid}?node={call['outputs']['ok']}")
    expect(page.locator("#detail code.format-kind")).to_have_text("choice")
    context.close()
