"""Issue 24, "dashboard polish": what screenshots showed wrong, checked in a real browser
against ``parrot serve`` on the real engine. The registration form shows the chosen kind's
fields only (JavaScript on or off); removing an engine asks first (a page, so JavaScript off
works too) and warns when it is the only one; a favicon is served (no 404 on any page); the
engines table and every page fit 390 px; the sparklines' "max" stays above their line; a
context tree fits 1280 px and says what its numbers are; one of a thing is singular.
Registering and removing with their notices are in test_browser's operator story."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Page, expect
from waiting import wait_until

from parrot.sdk import Client, Output
from parrot.web import words

from .conftest import WIDTHS
from .test_browser import shoot, sign_in

PAGES = ("/", "/sessions", "/requests", "/contexts", "/engines", "/login")
ONE = Output(max_tokens=1, temperature=0)


def no_overflow(page: Page) -> dict:
    """How far the page, and each table's box (which would hide what overflows it), overflow."""
    return page.evaluate(
        """() => ({
            page: document.documentElement.scrollWidth - document.documentElement.clientWidth,
            tables: [...document.querySelectorAll('.scroll > table')].map(
                t => t.parentElement.scrollWidth - t.parentElement.clientWidth),
        })"""
    )


@pytest.fixture(scope="module")
def signed_in(browser, dashboard_url):
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
    page = context.new_page()
    sign_in(page, dashboard_url)
    yield page
    context.close()


@pytest.mark.parametrize("javascript", [True, False])
def test_the_form_shows_the_chosen_kinds_fields_only(browser, dashboard_url, artifacts, javascript):
    context = browser.new_context(java_script_enabled=javascript)
    page = context.new_page()
    sign_in(page, dashboard_url)  # a plain form: works without JavaScript
    builtin, openai = (
        page.locator('fieldset[data-kind="builtin"]'),
        page.locator('fieldset[data-kind="openai"]'),
    )
    expect(builtin).to_be_visible()
    expect(openai).to_be_hidden()
    page.check("input[name=kind][value=openai]")
    expect(openai).to_be_visible()
    expect(builtin).to_be_hidden()
    if javascript:
        shoot(page, artifacts, "engines-form-openai")
    # Sent back with an error, the form shows the kind that was chosen.
    page.fill("#f-base", "http://127.0.0.1:9/v1")
    page.click("form.register button[type=submit]")
    expect(page.locator("#f-model + p.field-error")).to_be_visible()
    expect(openai).to_be_visible()
    expect(builtin).to_be_hidden()
    page.check("input[name=kind][value=builtin]")
    expect(builtin).to_be_visible()
    expect(openai).to_be_hidden()
    context.close()


@pytest.mark.parametrize("javascript", [True, False])
def test_removing_the_only_engine_asks_first_and_can_be_cancelled(browser, dashboard_url, javascript):
    url = dashboard_url
    context = browser.new_context(java_script_enabled=javascript)
    page = context.new_page()
    sign_in(page, url)
    engines = httpx.get(f"{url}/v1/engines").json()
    assert len(engines) == 1
    engine_id = page.locator("tr[data-engine]").get_attribute("data-engine")
    page.locator(f'tr[data-engine="{engine_id}"] a.danger').click()
    page.wait_for_url(f"{url}/engines/{engine_id}/remove")
    expect(page.locator("p.warning")).to_contain_text("the only engine")
    page.click("form.confirm-remove a.cancel")
    page.wait_for_url(f"{url}/engines")
    expect(page.locator(f'tr[data-engine="{engine_id}"]')).to_have_count(1)
    ids = [e["engine_id"] for e in engines]
    assert [e["engine_id"] for e in httpx.get(f"{url}/v1/engines").json()] == ids  # one click removes nothing
    # The confirmation page is the admin's: signed out, it asks to sign in.
    assert httpx.get(f"{url}/engines/{engine_id}/remove", follow_redirects=False).status_code == 303
    assert httpx.get(f"{url}/engines/nope/remove", cookies=context_cookies(context)).status_code == 404
    context.close()


def context_cookies(context) -> dict[str, str]:
    return {c["name"]: c["value"] for c in context.cookies()}


def test_a_favicon_is_served_and_no_page_asks_for_a_missing_file(browser, dashboard_url):
    url = dashboard_url
    for path in ("/favicon.ico", "/static/favicon.svg"):
        r = httpx.get(f"{url}{path}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml"), path
        assert r.text.startswith("<svg")
    context = browser.new_context()
    page = context.new_page()
    missing: list[str] = []
    page.on("response", lambda r: r.status >= 400 and missing.append(f"{r.status} {r.url}"))
    for path in PAGES:
        page.goto(f"{url}{path}")
        page.wait_for_load_state("load")
        assert page.locator('link[rel="icon"]').get_attribute("href") == "/static/favicon.svg"
    page.goto(f"{url}/sessions/no-such-session")  # the error page, a 404 itself
    missing.remove(f"404 {url}/sessions/no-such-session")
    assert missing == []
    context.close()


def test_every_page_fits_a_phone(signed_in, dashboard_url, artifacts):
    """At 390 px no page scrolls sideways and the tables (engines, sessions) show all their
    cells (they stack); pictures (DAG, trees, timeline) scroll inside their own boxes."""
    page, url = signed_in, dashboard_url
    with Client(url, timeout=120) as client, client.session() as session:
        call = session.submit("Say yes: {{a}}", outputs={"a": ONE})
        call.outputs["a"].get()
        page.set_viewport_size({"width": 390, "height": 800})
        for path in (*PAGES, f"/sessions/{session.session_id}?node={call.call_id}"):
            page.goto(f"{url}{path}")
            page.wait_for_load_state("load")
            assert no_overflow(page) == {
                "page": 0,
                "tables": [0] * page.locator(".scroll > table").count(),
            }, path
        page.goto(f"{url}/engines")
        cell = page.locator('tr[data-engine] td[data-label="URL"]').first
        # The live section is swapped on every update: between two swaps the cell is laid out.
        box = wait_until(cell.bounding_box, what="the engines table's URL cell laid out")
        assert box["x"] + box["width"] <= 390
    page.goto(f"{url}/sessions/no-such-session")
    shoot(page, artifacts, "error")


def test_the_sparklines_max_label_stays_above_the_line(signed_in, dashboard_url):
    page = signed_in
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{dashboard_url}/")
    expect(page.locator("svg.spark polyline").first).to_be_attached(timeout=30_000)  # two samples
    gaps = page.evaluate(
        """() => [...document.querySelectorAll('svg.spark')].filter(s => s.querySelector('polyline'))
            .map(s => {
                const label = s.querySelector('text').getBBox();
                const line = s.querySelector('polyline').getBBox();
                return line.y - (label.y + label.height);
            })"""
    )
    assert gaps and all(gap >= 0 for gap in gaps), gaps


def test_a_deep_context_tree_fits_1280_px_and_says_what_its_numbers_are(signed_in, dashboard_url, artifacts):
    """Six calls, each extending the previous one's prompt: a tree six forks deep, which was
    wider than the page and clipped."""
    page, url = signed_in, dashboard_url
    words_ = ["The", "keeper", "climbed", "the", "stairs", "slowly"]
    with Client(url, timeout=120) as client, client.session() as session:
        for i in range(1, len(words_) + 1):
            prompt = "Tell a tale of the sea. " + " and then ".join(words_[:i]) + " {{x}}"
            session.submit(prompt, outputs={"x": ONE}).outputs["x"].get()
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(f"{url}/contexts")
        tree = page.locator(f'g.ctx-node[data-sessions~="{session.session_id}"]')
        expect(tree.first).to_be_visible()
        overflow = page.evaluate(
            "() => [...document.querySelectorAll('.tree-box')].map(b => b.scrollWidth - b.clientWidth)"
        )
        assert overflow and all(o <= 0 for o in overflow), overflow
        box = page.locator("section.engine-tree").first
        expect(box).to_contain_text("contexts")
        texts = " ".join(page.locator("svg.ctx-tree text").all_text_contents())
        assert re.search(r"total \d+ tokens? · \d+ blocks?", texts), texts
        assert not re.search(r"\bsub \d|\bblk\b|\bctx\b", texts), texts
        shoot(page, artifacts, "contexts-deep")


def test_one_of_a_thing_is_singular(signed_in, dashboard_url):
    assert words.plural(1, "task") == "1 task" and words.plural(2, "task") == "2 tasks"
    assert words.plural(0, "context") == "0 contexts"
    page, url = signed_in, dashboard_url
    with Client(url, timeout=120) as client, client.session() as session:
        session.submit("Say yes: {{a}}", outputs={"a": ONE}).outputs["a"].get()
        for path in PAGES:
            page.goto(f"{url}{path}")
            text = page.locator("main").inner_text()
            assert not re.search(
                r"(?<![\d.])1 (calls|tasks|contexts|sessions|tokens|shared nodes)\b", text
            ), (
                path,
                text,
            )
        page.goto(f"{url}/")
        expect(page.locator(f'li:has(a[href="/sessions/{session.session_id}"])')).to_contain_text("1 call")
