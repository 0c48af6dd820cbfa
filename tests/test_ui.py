"""The web UI in a real headless browser: Debian's chromium driven by Playwright.

scripts/install-test-deps.sh installs chromium; the broker runs in-process with its
management API (and the UI) on an ephemeral port. No timings are asserted: every wait
is Playwright's own wait for something to appear on the page.
"""

from __future__ import annotations

import json
import re
import threading

import pika
import pytest
from playwright.sync_api import Page, expect

from access_setup import unique
from browser import chromium
from leveret.config import ServerConfig
from leveret.testing import embedded_broker
from test_management_api import call

pytestmark = pytest.mark.leveret_only

# Lists poll every 5 s and the overview every 2 s: waits for the next poll get this long.
POLL_WAIT_MS = 15_000


@pytest.fixture(scope="module")
def broker():
    config = ServerConfig(port=0, persistence=False, management_port=0)
    with embedded_broker(config) as b:
        yield b, f"http://127.0.0.1:{b.server.management.port}"


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser, broker):
    context = browser.new_context(viewport={"width": 1366, "height": 860}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("dialog", lambda dialog: dialog.accept())  # the UI's "Delete …?" confirmations
    page.goto(broker[1] + "/")
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"


def api(broker):
    """What test_management_api.call takes: (base URL of /api, AMQP URL)."""
    return (broker[1] + "/api", broker[0].url)


def log_in(page: Page, user: str = "guest", password: str = "guest") -> None:
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("#login-form button[type=submit]")


def go(page: Page, hash_: str) -> None:
    page.goto(page.url.split("#")[0] + hash_)


def row(page: Page, text: str):
    """The table row whose cells include exactly `text`."""
    cell = page.locator("td", has_text=re.compile(f"^{re.escape(text)}$"))
    return page.locator("tbody tr", has=cell)


def test_a_wrong_password_is_refused_and_the_right_one_opens_the_overview(page):
    log_in(page, "guest", "wrong")
    expect(page.locator("#login-error")).to_contain_text("Wrong username or password")
    expect(page.locator("#app")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('leveret-auth')") is None

    log_in(page)
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#login-error")).to_have_text("")
    expect(page.locator("main h1")).to_have_text("Overview")
    expect(page.locator("#whoami")).to_have_text("guest")
    # A reload keeps the session (sessionStorage), without asking again.
    page.reload()
    expect(page.locator("#whoami")).to_have_text("guest")
    expect(page.locator("#login")).to_be_hidden()

    page.click("#logout")
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("input[name=password]")).to_have_value("")
    assert page.evaluate("sessionStorage.getItem('leveret-auth')") is None


def test_create_a_queue_publish_get_purge_and_delete(page, broker):
    log_in(page)
    name = unique("ui-q")
    page.click("#nav >> text=Queues")
    page.fill("#add-queue input[name=name]", name)
    page.select_option("#add-queue select[name=durable]", "false")
    page.click("#add-queue button[type=submit]")
    link = page.locator(f"a:text-is('{name}')")
    expect(link).to_be_visible()
    status, queue = call(api(broker), "GET", f"/queues/%2F/{name}")
    assert status == 200 and queue["durable"] is False

    link.click()
    expect(page.locator("main h1")).to_contain_text(name)
    expect(page.locator("#queue-details")).to_contain_text("classic")
    # Its default-exchange binding is listed.
    expect(page.locator("#queue-bindings tbody")).to_contain_text("(AMQP default)")
    expect(page.locator("#queue-bindings tbody")).to_contain_text(name)

    # Publish through the default exchange: the routing key is the queue's name already.
    expect(page.locator("#publish input[name=routing_key]")).to_have_value(name)
    page.fill("#publish textarea[name=payload]", "hello from the browser")
    page.click("#publish button[type=submit]")
    expect(page.locator("#toast")).to_have_text("Message published")

    # Nack-and-requeue (the default mode) shows the message and leaves it in the queue.
    expect(page.locator("#get-messages select[name=ackmode]")).to_have_value("ack_requeue_true")
    page.click("#get-messages button[type=submit]")
    expect(page.locator("#messages pre.payload")).to_have_text("hello from the browser")
    expect(page.locator("#messages")).to_contain_text("22 bytes")
    page.click("#get-messages button[type=submit]")
    expect(page.locator("#messages")).to_contain_text("redelivered")
    expect(page.locator("#messages pre.payload")).to_have_text("hello from the browser")
    assert call(api(broker), "GET", f"/queues/%2F/{name}")[1]["messages_ready"] == 1

    # Purge empties it.
    page.click("#purge")
    expect(page.locator("#toast")).to_have_text("Queue purged")
    page.click("#get-messages button[type=submit]")
    expect(page.locator("#messages")).to_contain_text("The queue is empty.")
    assert call(api(broker), "GET", f"/queues/%2F/{name}")[1]["messages"] == 0

    page.click("#delete")
    expect(page).to_have_url(re.compile(r"#/queues$"))
    expect(page.locator(f"a:text-is('{name}')")).to_have_count(0)
    assert call(api(broker), "GET", f"/queues/%2F/{name}")[0] == 404


def test_ack_mode_removes_the_message(page, broker):
    name = unique("ui-ack")
    assert call(api(broker), "PUT", f"/queues/%2F/{name}", {"durable": False})[0] == 201
    body = {
        "routing_key": name,
        "payload": "take me",
        "payload_encoding": "string",
        "properties": {},
    }
    assert call(api(broker), "POST", "/exchanges/%2F/amq.default/publish", body)[1]["routed"]
    try:
        log_in(page)
        go(page, f"#/queues/%2F/{name}")
        page.select_option("#get-messages select[name=ackmode]", "ack_requeue_false")
        page.click("#get-messages button[type=submit]")
        expect(page.locator("#messages pre.payload")).to_have_text("take me")
        page.click("#get-messages button[type=submit]")
        expect(page.locator("#messages")).to_contain_text("The queue is empty.")
    finally:
        call(api(broker), "DELETE", f"/queues/%2F/{name}")


def publish_until(url: str, stop: threading.Event, failures: list[BaseException]) -> None:
    """Publish to a queue nobody reads until told to stop, so rates and depths rise."""
    try:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        while not stop.is_set():
            for _ in range(20):
                channel.basic_publish("", queue, b"tick")
            connection.process_data_events(0.02)
        connection.close()
    except BaseException as exc:  # seen by the test, not lost in the thread
        failures.append(exc)


def chart_value(page: Page, chart: str, series: int) -> float:
    last = page.locator(f"#{chart}").get_attribute("data-last") or "0"
    return float(last.split(",")[series])


def test_the_overview_charts_follow_published_traffic(page, broker):
    log_in(page)
    rates, queued = page.locator("#chart-rates"), page.locator("#chart-queued")
    expect(rates).to_have_attribute("data-samples", re.compile(r"^[1-9]"))
    expect(queued).to_have_attribute("data-last", re.compile(r"^[\d.]+,[\d.]+$"))
    stop, failures = threading.Event(), []
    publisher = threading.Thread(target=publish_until, args=(broker[0].url, stop, failures))
    publisher.start()
    try:
        # The publish rate (first series) and the ready messages (first series) go above 0.
        page.wait_for_function(
            "() => Number(document.querySelector('#chart-rates').dataset.last.split(',')[0]) > 0",
            timeout=POLL_WAIT_MS,
        )
        page.wait_for_function(
            "() => Number(document.querySelector('#chart-queued').dataset.last.split(',')[0]) > 0",
            timeout=POLL_WAIT_MS,
        )
    finally:
        stop.set()
        publisher.join(10)
    assert failures == []
    assert chart_value(page, "chart-rates", 0) > 0
    assert chart_value(page, "chart-queued", 0) > 0
    assert int(rates.get_attribute("data-samples")) > 1  # it kept polling
    # The legend shows the newest value beside its label, and the tiles count the connection.
    expect(page.locator(".legend b").first).not_to_have_text("0")
    expect(page.locator(".tile", has_text="Connections").locator("b")).to_have_text(
        re.compile(r"^[1-9]")
    )


def test_tables_filter_sort_and_page(page, broker):
    prefix = unique("ui-t")
    for i in range(25):
        assert (
            call(api(broker), "PUT", f"/queues/%2F/{prefix}-{i:02d}", {"durable": False})[0] == 201
        )
    # Messages in three queues, so sorting by Ready has something to order.
    for i, count in ((3, 2), (7, 5), (11, 1)):
        for _ in range(count):
            body = {
                "routing_key": f"{prefix}-{i:02d}",
                "payload": "x",
                "payload_encoding": "string",
                "properties": {},
            }
            assert call(api(broker), "POST", "/exchanges/%2F/amq.default/publish", body)[0] == 200
    try:
        log_in(page)
        page.click("#nav >> text=Queues")
        page.fill("input[aria-label=filter]", prefix)
        rows = page.locator("#list tbody tr")
        expect(rows).to_have_count(20)  # one page
        expect(page.locator("[data-role=page]")).to_have_text("1 / 2 · 25 items")
        page.click("[aria-label='next page']")
        expect(rows).to_have_count(5)
        expect(page.locator("[data-role=page]")).to_have_text("2 / 2 · 25 items")
        page.click("[aria-label='previous page']")
        expect(rows.first).to_contain_text(f"{prefix}-00")
        page.click("th[data-key=name]")  # sorted by name already: now descending
        expect(page.locator("th[data-key=name]")).to_have_class(re.compile(r"\bdesc\b"))
        expect(rows.first).to_contain_text(f"{prefix}-24")
        # One process: no worker column (a broker of several workers shows it)
        expect(page.locator("th[data-key=worker]")).to_be_hidden()
        page.click("th[data-key=messages_ready]")  # a number column: biggest first
        expect(rows.nth(0)).to_contain_text(f"{prefix}-07")
        expect(rows.nth(1)).to_contain_text(f"{prefix}-03")
        expect(rows.nth(2)).to_contain_text(f"{prefix}-11")
        page.click("th[data-key=messages_ready]")  # and again: smallest first
        expect(rows.first.locator("td").nth(4)).to_have_text("0")
        page.fill("input[aria-label=filter]", f"{prefix}-1")
        expect(rows).to_have_count(10)
        page.fill("input[aria-label=filter]", "no-such-queue-anywhere")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_text("Nothing matches the filter.")
    finally:
        for i in range(25):
            call(api(broker), "DELETE", f"/queues/%2F/{prefix}-{i:02d}")


def test_statistics_the_broker_does_not_report_show_as_zero(page):
    log_in(page)
    page.click("#nav >> text=Exchanges")
    # amq.direct has seen no traffic here: no message_stats, so its rates read 0, not blank.
    cells = row(page, "amq.direct").locator("td")
    expect(cells.nth(4)).to_have_text("0")
    expect(cells.nth(5)).to_have_text("0")


def make_user(broker, tags: str) -> str:
    user = unique("ui-u")
    assert call(api(broker), "PUT", f"/users/{user}", {"password": "pw", "tags": tags})[0] == 201
    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    assert call(api(broker), "PUT", f"/permissions/%2F/{user}", perms)[0] == 201
    return user


def test_a_management_user_sees_no_admin_pages(page, broker):
    user = make_user(broker, "management")
    try:
        log_in(page, user, "pw")
        expect(page.locator("#whoami")).to_have_text(user)
        expect(page.locator("#nav >> text=Queues")).to_be_visible()
        for hidden in ("Users", "Vhosts", "Permissions", "Definitions", "Policies"):
            expect(page.locator(f"#nav >> text={hidden}")).to_be_hidden()
        # Typing the address gets an explanation, not the page.
        go(page, "#/users")
        expect(page.locator("#forbidden")).to_contain_text("needs the administrator tag")
        expect(page.locator("#add-user")).to_have_count(0)
        # And the API behind the page refuses it too.
        assert call(api(broker), "GET", "/users", user=user, password="pw")[0] == 401
    finally:
        call(api(broker), "DELETE", f"/users/{user}")


def test_a_policymaker_gets_policies_but_not_users(page, broker):
    user = make_user(broker, "policymaker")
    try:
        log_in(page, user, "pw")
        expect(page.locator("#nav >> text=Policies")).to_be_visible()
        expect(page.locator("#nav >> text=Users")).to_be_hidden()
        page.click("#nav >> text=Policies")
        expect(page.locator("#add-policy")).to_be_visible()
    finally:
        call(api(broker), "DELETE", f"/users/{user}")


def test_a_deleted_user_is_sent_back_to_the_login_form(page, broker):
    user = make_user(broker, "management")
    log_in(page, user, "pw")
    expect(page.locator("#whoami")).to_have_text(user)
    assert call(api(broker), "DELETE", f"/users/{user}")[0] == 204
    # The overview's next poll is refused; the UI drops the stale credentials.
    expect(page.locator("#login")).to_be_visible(timeout=POLL_WAIT_MS)
    expect(page.locator("#login-error")).to_contain_text("session has ended")


def test_exchange_page_binds_publishes_and_unbinds(page, broker):
    exchange, queue = unique("ui-x"), unique("ui-xq")
    assert call(api(broker), "PUT", f"/exchanges/%2F/{exchange}", {"type": "direct"})[0] == 201
    assert call(api(broker), "PUT", f"/queues/%2F/{queue}", {"durable": False})[0] == 201
    try:
        log_in(page)
        page.click("#nav >> text=Exchanges")
        page.click(f"a:text-is('{exchange}')")
        expect(page.locator("main h1")).to_contain_text(exchange)
        expect(page.locator("#exchange-details")).to_contain_text("direct")
        page.fill("#add-binding input[name=destination]", queue)
        page.fill("#add-binding input[name=routing_key]", "rk")
        page.click("#add-binding button[type=submit]")
        expect(page.locator("#exchange-bindings tbody")).to_contain_text(queue)
        page.fill("#publish input[name=routing_key]", "rk")
        page.fill("#publish textarea[name=payload]", "via the exchange")
        page.click("#publish button[type=submit]")
        expect(page.locator("#toast")).to_have_text("Message published")
        status, got = call(
            api(broker),
            "POST",
            f"/queues/%2F/{queue}/get",
            {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
        )
        assert status == 200 and got[0]["payload"] == "via the exchange"
        # An unroutable publish is reported as such.
        page.fill("#publish input[name=routing_key]", "nobody-listens")
        page.click("#publish button[type=submit]")
        expect(page.locator("#toast")).to_contain_text("not routed")
        page.click("#exchange-bindings button:text('Unbind')")
        expect(page.locator("#exchange-bindings tbody")).to_contain_text("Nothing here yet.")
        assert call(api(broker), "GET", f"/exchanges/%2F/{exchange}/bindings/source")[1] == []
    finally:
        call(api(broker), "DELETE", f"/exchanges/%2F/{exchange}")
        call(api(broker), "DELETE", f"/queues/%2F/{queue}")


def test_the_default_exchange_page_opens(page):
    log_in(page)
    page.click("#nav >> text=Exchanges")
    page.click("a:text-is('(AMQP default)')")
    expect(page.locator("main h1")).to_contain_text("(AMQP default)")
    expect(page.locator("#exchange-details")).to_contain_text("direct")
    expect(page.locator("#add-binding")).to_have_count(0)  # it takes no bindings


def test_admin_pages_create_and_delete(page, broker):
    vhost, user, policy = unique("ui-vh"), unique("ui-nu"), unique("ui-p")
    try:
        log_in(page)
        page.click("#nav >> text=Vhosts")
        page.fill("#add-vhost input[name=name]", vhost)
        page.click("#add-vhost button[type=submit]")
        expect(row(page, vhost)).to_have_count(1)
        assert call(api(broker), "GET", f"/vhosts/{vhost}")[0] == 200

        page.click("#nav >> text=Users")
        page.fill("#add-user input[name=name]", user)
        page.fill("#add-user input[name=password]", "secret")
        page.fill("#add-user input[name=tags]", "monitoring")
        page.click("#add-user button[type=submit]")
        expect(row(page, user)).to_contain_text("monitoring")

        page.click("#nav >> text=Permissions")
        page.select_option("#set-permission select[name=user]", user)
        page.select_option("#set-permission select[name=vhost]", vhost)
        page.fill("#set-permission input[name=write]", "^amq\\.gen")
        page.click("#set-permission button[type=submit]")
        expect(row(page, user)).to_contain_text("^amq\\.gen")
        status, perm = call(api(broker), "GET", f"/permissions/{vhost}/{user}")
        assert status == 200 and perm["write"] == "^amq\\.gen" and perm["read"] == ".*"
        row(page, user).locator("button:text('Revoke')").click()
        expect(row(page, user)).to_have_count(0)
        assert call(api(broker), "GET", f"/permissions/{vhost}/{user}")[0] == 404

        page.click("#nav >> text=Policies")
        page.select_option("#add-policy select[name=vhost]", vhost)
        page.fill("#add-policy input[name=name]", policy)
        page.fill("#add-policy input[name=pattern]", "^ui\\.")
        page.select_option("#add-policy select[name=apply_to]", "queues")
        page.fill("#add-policy textarea[name=definition]", '{"max-length": 7}')
        page.click("#add-policy button[type=submit]")
        expect(row(page, policy)).to_contain_text('{"max-length":7}')
        status, got = call(api(broker), "GET", f"/policies/{vhost}/{policy}")
        assert status == 200 and got["definition"] == {"max-length": 7}
        # A definition that is not JSON never reaches the API.
        page.fill("#add-policy textarea[name=definition]", "{not json")
        page.click("#add-policy button[type=submit]")
        expect(page.locator("#toast")).to_contain_text("the definition is not JSON")
        row(page, policy).locator("button:text('Delete')").click()
        expect(row(page, policy)).to_have_count(0)
        assert call(api(broker), "GET", f"/policies/{vhost}/{policy}")[0] == 404

        page.click("#nav >> text=Users")
        row(page, user).locator("button:text('Delete')").click()
        expect(row(page, user)).to_have_count(0)
        assert call(api(broker), "GET", f"/users/{user}")[0] == 404

        page.click("#nav >> text=Vhosts")
        row(page, vhost).locator("button:text('Delete')").click()
        expect(row(page, vhost)).to_have_count(0)
        assert call(api(broker), "GET", f"/vhosts/{vhost}")[0] == 404
    finally:
        call(api(broker), "DELETE", f"/users/{user}")
        call(api(broker), "DELETE", f"/vhosts/{vhost}")


def test_definitions_export_and_import(page, broker, tmp_path):
    queue = unique("ui-def")
    log_in(page)
    page.click("#nav >> text=Definitions")
    with page.expect_download() as download_info:
        page.click("#export")
    assert download_info.value.suggested_filename == "leveret-definitions.json"
    exported = json.loads(open(download_info.value.path()).read())
    assert any(u["name"] == "guest" for u in exported["users"])
    assert any(v["name"] == "/" for v in exported["vhosts"])

    # Import a file that adds one queue.
    file = tmp_path / "defs.json"
    file.write_text(
        json.dumps(
            {
                "queues": [
                    {
                        "name": queue,
                        "vhost": "/",
                        "durable": True,
                        "auto_delete": False,
                        "arguments": {},
                    }
                ]
            }
        )
    )
    try:
        page.set_input_files("#import input[name=file]", str(file))
        page.click("#import button[type=submit]")
        expect(page.locator("#toast")).to_have_text("Definitions imported")
        expect(page.locator("#import-result")).to_contain_text("1 queues")
        status, got = call(api(broker), "GET", f"/queues/%2F/{queue}")
        assert status == 200 and got["durable"] is True
        # A file that is not JSON is refused before it is sent.
        file.write_text("this is not json")
        page.set_input_files("#import input[name=file]", str(file))
        page.click("#import button[type=submit]")
        expect(page.locator("#toast")).to_contain_text("the file is not JSON")
    finally:
        call(api(broker), "DELETE", f"/queues/%2F/{queue}")


def test_static_files_need_no_credentials_and_the_api_does(broker):
    import urllib.error
    import urllib.request

    for path in ("/", "/ui/app.js", "/ui/style.css"):
        with urllib.request.urlopen(broker[1] + path, timeout=10) as response:
            assert response.status == 200
            body = response.read().decode()
            assert "http://" not in body and "https://" not in body  # nothing from outside
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(broker[1] + "/api/overview", timeout=10)
    assert exc.value.code == 401


def test_the_top_menu_is_usable_in_a_narrow_window(browser, broker):
    """At 420 px every menu entry is inside the window and opens its page."""
    context = browser.new_context(viewport={"width": 420, "height": 800})
    page = context.new_page()
    try:
        page.goto(broker[1] + "/")
        log_in(page)
        expect(page.locator("#app")).to_be_visible()
        links = page.locator("#nav a:visible")
        count = links.count()
        assert count >= 8  # an administrator's menu
        for i in range(count):
            box = links.nth(i).bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 420, (
                links.nth(i).inner_text(),
                box,
            )
        # The page heading is not hidden under the bar, and the last entry works.
        last = links.nth(count - 1)
        name = last.inner_text()
        last.click()
        expect(page.locator("main h1")).to_contain_text(name)
        assert page.evaluate("document.documentElement.scrollWidth") <= 420
    finally:
        context.close()


#: every property the publish form takes, as typed into it (RabbitMQ's names)
FORM_PROPERTIES = {
    "content_type": "text/plain",
    "content_encoding": "utf-8",
    "priority": "3",
    "correlation_id": "c1",
    "reply_to": "r1",
    "expiration": "60000",
    "message_id": "m1",
    "timestamp": "1700000000",
    "type": "t1",
    "user_id": "guest",
    "app_id": "a1",
    "cluster_id": "cl1",
}


def test_the_publish_form_sends_every_property_and_get_shows_them(page, broker):
    name = unique("ui-props")
    assert call(api(broker), "PUT", f"/queues/%2F/{name}", {"durable": False})[0] == 201
    try:
        log_in(page)
        go(page, f"#/queues/%2F/{name}")
        page.select_option("#publish select[name=persistent]", "true")
        page.fill(
            "#publish textarea[name=properties]",
            "\n".join(f"{k} = {v}" for k, v in FORM_PROPERTIES.items()),
        )
        page.fill("#publish textarea[name=headers]", "retries = 3\nsource = the form")
        page.fill("#publish textarea[name=payload]", "with properties")
        page.click("#publish button[type=submit]")
        expect(page.locator("#toast")).to_have_text("Message published")

        # What the API stored: every property under its name, integers as numbers.
        take = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
        status, messages = call(api(broker), "POST", f"/queues/%2F/{name}/get", take)
        assert status == 200
        ints = ("priority", "timestamp")
        assert messages[0]["properties"] == {
            **{k: int(v) if k in ints else v for k, v in FORM_PROPERTIES.items()},
            "delivery_mode": 2,
            "headers": {"retries": 3, "source": "the form"},
        }
        # And the page's get shows them.
        page.click("#get-messages button[type=submit]")
        shown = page.locator("#messages")
        expect(shown.locator("pre.payload")).to_have_text("with properties")
        for key, value in FORM_PROPERTIES.items():
            text = value if key in ("priority", "timestamp") else f'"{value}"'
            expect(shown).to_contain_text(f'"{key}":{text}')
        expect(shown).to_contain_text('"headers":{"retries":3,"source":"the form"}')
        expect(shown).to_contain_text('"delivery_mode":2')
    finally:
        call(api(broker), "DELETE", f"/queues/%2F/{name}")


def test_the_publish_form_reports_bad_properties(page, broker):
    name = unique("ui-badprops")
    assert call(api(broker), "PUT", f"/queues/%2F/{name}", {"durable": False})[0] == 201
    try:
        log_in(page)
        go(page, f"#/queues/%2F/{name}")
        page.fill("#publish textarea[name=payload]", "never sent")
        for properties, toast in (
            # the API's answer, as RabbitMQ words it
            ("priority = high", 'Message published failed: ["not_int","priority"]'),
            (
                "expiration = soon",
                "Message published failed: 406 PRECONDITION_FAILED - invalid expiration "
                "'soon': no_integer",
            ),
            (
                "priority = 256",
                "Message published failed: property priority must be an "
                "integer from 0 to 255, got 256",
            ),
            # refused by the form: the API would ignore a name it does not know
            ("colour = blue", 'Message published failed: unknown property "colour"'),
            ("no equals sign", 'Message published failed: Properties: "no equals sign" is not'),
        ):
            page.fill("#publish textarea[name=properties]", properties)
            page.click("#publish button[type=submit]")
            expect(page.locator("#toast")).to_contain_text(toast)
        assert call(api(broker), "GET", f"/queues/%2F/{name}")[1]["messages"] == 0
    finally:
        call(api(broker), "DELETE", f"/queues/%2F/{name}")
