"""The web UI's shovels and federation page, in Debian's chromium (as tests/test_ui.py).

No timings are asserted: every wait is Playwright's wait for something on the page.
"""

from __future__ import annotations

import pytest
from links_support import api, free_port, put_shovel
from playwright.sync_api import expect

from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from test_ui import POLL_WAIT_MS, browser, go, log_in, make_user, page, row  # noqa: F401

pytestmark = pytest.mark.leveret_only


@pytest.fixture(scope="module")
def broker():
    config = ServerConfig(port=0, persistence=False, management_port=0)
    with embedded_broker(config) as b:
        yield b, f"http://127.0.0.1:{b.server.management.port}"


def test_the_page_lists_shovels_and_links_with_their_states(page, broker):  # noqa: F811
    b, base = broker
    log_in(page)
    put_shovel(
        base,
        "nowhere",
        {
            "src-uri": "amqp://",
            "src-queue": "stuck",
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{free_port()}",
            "dest-queue": "x",
            "reconnect-delay": 1,
        },
    )
    api(base, "PUT", "/api/exchanges/%2F/up", {"type": "fanout", "durable": True})
    api(base, "PUT", "/api/exchanges/%2F/down", {"type": "fanout", "durable": True})
    api(
        base,
        "PUT",
        "/api/parameters/federation-upstream/%2F/self",
        {"value": {"uri": "amqp://", "exchange": "up"}},
    )
    api(
        base,
        "PUT",
        "/api/policies/%2F/fed",
        {"pattern": "^down$", "definition": {"federation-upstream": "self"}},
    )
    page.click("#nav >> text=Shovels & federation")
    # Add a shovel with the form; it runs.
    page.fill("#add-shovel input[name=name]", "drain")
    page.fill("#add-shovel input[name=src_queue]", "in")
    page.fill("#add-shovel input[name=dest_queue]", "out")
    page.click("#add-shovel button[type=submit]")
    drain = row(page, "drain")
    expect(drain.locator(".state")).to_have_text("running", timeout=POLL_WAIT_MS)
    # The unreachable one is listed with why it does not run.
    stuck = row(page, "nowhere")
    expect(stuck.locator(".state")).to_have_text("starting", timeout=POLL_WAIT_MS)
    expect(stuck).to_contain_text("cannot connect", timeout=POLL_WAIT_MS)
    link = page.locator("#federation-links tbody tr", has_text="down")
    expect(link.locator(".state")).to_have_text("running", timeout=POLL_WAIT_MS)
    expect(link).to_contain_text("self")
    link.locator("text=Restart").click()
    expect(page.locator("#toast")).to_contain_text("restarted")
    drain.locator("text=Delete").click()
    expect(row(page, "drain")).to_have_count(0, timeout=POLL_WAIT_MS)
    assert api(base, "GET", "/api/parameters/shovel/%2F/drain")[0] == 404


def test_management_users_are_not_offered_the_page(page, broker):  # noqa: F811
    b, base = broker
    user = make_user(broker, "management")
    try:
        log_in(page, user, "pw")
        expect(page.locator("#nav >> text=Overview")).to_be_visible()
        expect(page.locator("#nav >> text=Shovels & federation")).to_be_hidden()
        assert api(base, "GET", "/api/shovels", user=f"{user}:pw")[0] == 401
    finally:
        api(base, "DELETE", f"/api/users/{user}")
