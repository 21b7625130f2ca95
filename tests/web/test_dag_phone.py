"""Issue 38 §4: the DAG's legend names every kind of node it draws (typed variables had no
entry), and at 390 px the DAG is no longer cut off: a small one shrinks to fit its box; a
long one, at no less than ``MIN_SCALE``, scrolls in its box, whose edge shows there is more.
A real browser on ``parrot serve`` with the real engine."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from parrot.web.svg.dag import MIN_SCALE

from .test_browser import shoot

SCHEMA = {"type": "object", "properties": {"tide": {"type": "string"}}}


def session_with(url: str, chain: int) -> str:
    """A session: a typed variable read by a chain of ``chain`` one-token calls."""
    with httpx.Client(base_url=url, timeout=120) as api:
        s = api.post("/v1/session").json()
        sid, auth = s["session_id"], {"Authorization": f"Bearer {s['session_auth']}"}
        var = api.post(
            "/v1/semantic_var",
            json={
                "session_id": sid,
                "name": "log",
                "value": '{"tide": "high at noon"}',
                "format": {"json_schema": SCHEMA},
            },
            headers=auth,
        ).json()["var_id"]
        for step in range(chain):
            body = {
                "session_id": sid,
                "template": f"Harbour note {step}: {{{{log}}}} Next word: {{{{out}}}}",
                "parameters": [
                    {"name": "log", "var_id": var},
                    {"name": "out", "is_output": True, "sampling": {"max_tokens": 1, "temperature": 0}},
                ],
            }
            var = api.post("/v1/semantic_call", json=body, headers=auth).json()["outputs"]["out"]
        got = api.get(f"/v1/semantic_var/{var}", params={"session_id": sid, "timeout": 120}, headers=auth)
        assert got.status_code == 200, got.text
    return sid


def dag_box(page) -> dict:
    return page.evaluate(
        """() => {
            const box = document.querySelector('.dag-box'), svg = box.querySelector('svg.dag');
            return {overflow: box.scrollWidth - box.clientWidth, drawn: svg.getBoundingClientRect().width,
                    natural: svg.viewBox.baseVal.width, page: document.documentElement.scrollWidth
                        - document.documentElement.clientWidth};
        }"""
    )


def test_the_legend_names_typed_variables(browser, dashboard_url, artifacts):
    sid = session_with(dashboard_url, 1)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{dashboard_url}/sessions/{sid}")
    typed = page.locator("svg.dag g.node.var.typed")
    expect(typed).to_have_count(1)
    expect(page.locator(".legend .key.var.typed")).to_have_text("typed variable (JSON, regex or grammar)")
    # Its swatch is drawn as the node is: the same border colour.
    colours = page.evaluate(
        """() => [getComputedStyle(document.querySelector('svg.dag .var.typed rect')).stroke,
                  getComputedStyle(document.querySelector('.legend .key.var.typed'), '::before')
                      .borderTopColor]"""
    )
    assert colours[0] == colours[1], colours
    shoot(page, artifacts, "session-typed-legend")
    context.close()


def test_at_390_px_a_small_dag_fits_and_a_long_one_scrolls(browser, dashboard_url, artifacts):
    small, long = session_with(dashboard_url, 1), session_with(dashboard_url, 6)
    context = browser.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    page.goto(f"{dashboard_url}/sessions/{small}")
    expect(page.locator("svg.dag g.node")).to_have_count(3)
    box = dag_box(page)
    assert box["overflow"] <= 0 and box["page"] <= 0, box  # the whole DAG in view
    assert box["natural"] > box["drawn"] >= MIN_SCALE * box["natural"] - 1, box  # shrunk to fit
    shoot(page, artifacts, "session-small-dag")
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto(f"{dashboard_url}/sessions/{long}")
    expect(page.locator("svg.dag g.node")).to_have_count(13)
    box = dag_box(page)
    assert box["overflow"] > 0 and box["page"] <= 0, box  # it scrolls in its box, not the page
    assert abs(box["drawn"] - MIN_SCALE * box["natural"]) <= 1, box  # as small as it gets
    context.close()
