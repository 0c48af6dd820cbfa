"""The web UI in a real headless browser: Debian's chromium driven by Playwright.

scripts/install-test-deps.sh installs chromium; the broker runs in-process with its
management API (and the UI) on an ephemeral port. No timings are asserted: every wait
is Playwright's own wait for something to appear.
"""

from __future__ import annotations

import re
import shutil

import pika
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from access_setup import unique
from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from test_management_api import call

pytestmark = pytest.mark.leveret_only

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Debian's chromium is missing: run scripts/install-test-deps.sh"
    return path


@pytest.fixture(scope="module")
def broker():
    config = ServerConfig(port=0, persistence=False, management_port=0)
    with embedded_broker(config) as b:
        yield b, f"http://127.0.0.1:{b.server.management.port}"


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, broker):
    context = browser.new_context(viewport={"width": 1366, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(broker[1] + "/")
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


def api(broker):
    return (broker[1] + "/api", broker[0].url)


def log_in(page: Page, user: str = "guest", password: str = "guest") -> None:
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("#login-form button[type=submit]")


def test_a_wrong_password_is_refused_and_the_right_one_opens_the_overview(page):
    log_in(page, "guest", "wrong")
    expect(page.locator("#login-error")).to_contain_text("Wrong username or password")
    expect(page.locator("#app")).to_be_hidden()
    log_in(page)
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("main h1")).to_have_text("Overview")
    expect(page.locator("#whoami")).to_have_text("guest")
    page.click("#logout")
    expect(page.locator("#login")).to_be_visible()


def test_create_a_queue_publish_and_get_the_message_back(page):
    log_in(page)
    name = unique("ui-q")
    page.click("#nav >> text=Queues")
    page.fill("#add-queue input[name=name]", name)
    page.select_option("#add-queue select[name=durable]", "false")
    page.click("#add-queue button[type=submit]")
    link = page.locator(f"a:text-is('{name}')")
    expect(link).to_be_visible()
    link.click()
    expect(page.locator("main h1")).to_contain_text(name)
    expect(page.locator("dl.props")).to_contain_text("classic")
    page.fill("#publish textarea[name=payload]", "hello from the browser")
    page.click("#publish button[type=submit]")
    expect(page.locator("#toast")).to_have_text("Message published")
    page.select_option("#get-messages select[name=ackmode]", "ack_requeue_false")
    page.click("#get-messages button[type=submit]")
    expect(page.locator("#messages pre.payload")).to_have_text("hello from the browser")
    # The message was acknowledged by the get: the queue is empty now.
    page.click("#get-messages button[type=submit]")
    expect(page.locator("#messages")).to_contain_text("The queue is empty.")
    # Its default-exchange binding is listed.
    expect(page.locator("table").nth(1)).to_contain_text(name)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    expect(page).to_have_url(re.compile(r"#/queues$"))
    expect(page.locator(f"a:text-is('{name}')")).to_have_count(0)


def test_the_overview_chart_follows_the_publish_rate(page, broker):
    log_in(page)
    chart = page.locator("#chart-rates")
    expect(chart).to_have_attribute("data-samples", "1")
    connection = pika.BlockingConnection(pika.URLParameters(broker[0].url))
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    try:
        # Publish until the chart's newest sample shows a publish rate above zero.
        for _ in range(400):
            for _ in range(50):
                channel.basic_publish("", queue, b"tick")
            connection.process_data_events(0.05)
            last = chart.get_attribute("data-last") or "0"
            if float(last.split(",")[0]) > 0:
                break
        assert float(chart.get_attribute("data-last").split(",")[0]) > 0
        assert int(chart.get_attribute("data-samples")) > 1
        queued = page.locator("#chart-queued")
        page.wait_for_function(
            "() => Number(document.querySelector('#chart-queued').dataset.last.split(',')[0]) > 0"
        )
        assert float(queued.get_attribute("data-last").split(",")[0]) > 0
    finally:
        connection.close()


def test_tables_filter_sort_and_page(page, broker):
    prefix = unique("ui-t")
    for i in range(25):
        assert (
            call(api(broker), "PUT", f"/queues/%2F/{prefix}-{i:02d}", {"durable": False})[0] == 201
        )
    try:
        log_in(page)
        page.click("#nav >> text=Queues")
        page.fill("input[aria-label=filter]", prefix)
        rows = page.locator("tbody tr")
        expect(rows).to_have_count(20)  # one page
        expect(page.locator("[data-role=page]")).to_have_text("1 / 2 · 25 items")
        page.click(".pager button >> text=›")
        expect(rows).to_have_count(5)
        page.click(".pager button >> text=‹")
        expect(rows.first).to_contain_text(f"{prefix}-00")
        page.click("th[data-key=name]")  # sorted by name already: now descending
        expect(rows.first).to_contain_text(f"{prefix}-24")
        page.fill("input[aria-label=filter]", f"{prefix}-1")
        expect(rows).to_have_count(10)
    finally:
        for i in range(25):
            call(api(broker), "DELETE", f"/queues/%2F/{prefix}-{i:02d}")


def test_a_management_user_sees_no_admin_pages(page, broker):
    user = unique("ui-u")
    assert (
        call(api(broker), "PUT", f"/users/{user}", {"password": "pw", "tags": "management"})[0]
        == 201
    )
    assert (
        call(
            api(broker),
            "PUT",
            f"/permissions/%2F/{user}",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )[0]
        == 201
    )
    try:
        log_in(page, user, "pw")
        expect(page.locator("#whoami")).to_have_text(user)
        expect(page.locator("#nav >> text=Queues")).to_be_visible()
        for hidden in ("Users", "Vhosts", "Definitions", "Policies"):
            expect(page.locator(f"#nav >> text={hidden}")).to_be_hidden()
        # And the API behind the page refuses it too, with RabbitMQ's body.
        page.goto(page.url.split("#")[0] + "#/users")
        expect(page.locator("#toast")).to_contain_text("Not administrator user")
    finally:
        call(api(broker), "DELETE", f"/users/{user}")


def test_exchange_page_binds_and_publishes(page, broker):
    exchange, queue = unique("ui-x"), unique("ui-xq")
    assert call(api(broker), "PUT", f"/exchanges/%2F/{exchange}", {"type": "direct"})[0] == 201
    assert call(api(broker), "PUT", f"/queues/%2F/{queue}", {"durable": False})[0] == 201
    try:
        log_in(page)
        page.goto(page.url.split("#")[0] + f"#/exchanges/%2F/{exchange}")
        expect(page.locator("main h1")).to_contain_text(exchange)
        page.fill("#add-binding input[name=destination]", queue)
        page.fill("#add-binding input[name=routing_key]", "rk")
        page.click("#add-binding button[type=submit]")
        expect(page.locator("tbody")).to_contain_text(queue)
        page.fill("#publish input[name=routing_key]", "rk")
        page.fill("#publish textarea[name=payload]", "via the exchange")
        page.click("#publish button[type=submit]")
        expect(page.locator("#toast")).to_have_text("Message published")
        status, got = call(
            api(broker),
            "POST",
            f"/queues/%2F/{queue}/get",
            {"count": 1, "ackmode": "ack_requeue_false"},
        )
        assert status == 200 and got[0]["payload"] == "via the exchange"
    finally:
        call(api(broker), "DELETE", f"/exchanges/%2F/{exchange}")
        call(api(broker), "DELETE", f"/queues/%2F/{queue}")


def test_definitions_export_downloads_json(page):
    log_in(page)
    page.click("#nav >> text=Definitions")
    with page.expect_download() as download_info:
        page.click("#export")
    path = download_info.value.path()
    text = open(path).read()
    assert '"users"' in text and '"vhosts"' in text
