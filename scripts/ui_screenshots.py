#!/usr/bin/env python3
"""Regenerate docs/ui/*.png: the web UI's main pages with some traffic, in headless chromium.

python scripts/ui_screenshots.py            (needs Debian's chromium and playwright:
                                             scripts/install-test-deps.sh installs both)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pika
from playwright.sync_api import sync_playwright

from leveret.config import ServerConfig
from leveret.testing import embedded_broker

OUT = Path(__file__).resolve().parent.parent / "docs" / "ui"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def traffic(url: str, stop: threading.Event) -> None:
    """A producer and a slow consumer, so rates and queue depths move."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.exchange_declare("orders", "topic", durable=True)
    for name, key in (("orders.eu", "eu.*"), ("orders.us", "us.*"), ("audit", "#")):
        channel.queue_declare(name, durable=True)
        channel.queue_bind(name, "orders", key)
    channel.basic_qos(prefetch_count=20)
    channel.basic_consume("orders.eu", lambda ch, m, p, b: ch.basic_ack(m.delivery_tag))
    i = 0
    while not stop.is_set():
        for _ in range(40):
            i += 1
            channel.basic_publish("orders", ("eu.new", "us.new")[i % 2], b'{"order": %d}' % i)
        connection.process_data_events(0.1)
    connection.close()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with embedded_broker(ServerConfig(port=0, persistence=False, management_port=0)) as broker:
        base = f"http://127.0.0.1:{broker.server.management.port}/"
        stop = threading.Event()
        worker = threading.Thread(target=traffic, args=(broker.url, stop), daemon=True)
        worker.start()
        time.sleep(1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1366, "height": 820})
            page.goto(base)
            page.fill("input[name=username]", "guest")
            page.fill("input[name=password]", "guest")
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#chart-rates")
            page.wait_for_function(
                "() => Number(document.querySelector('#chart-rates').dataset.samples) >= 8"
            )
            page.screenshot(path=OUT / "overview.png")
            for name, hash_, ready in (
                ("queues", "#/queues", "a:text-is('audit')"),
                ("queue", "#/queues/%2F/orders.eu", "#queue-consumers td.num"),
                ("exchanges", "#/exchanges", "a:text-is('orders')"),
                ("connections", "#/connections", "tbody button"),
                ("users", "#/users", "td:text-is('guest')"),
            ):
                page.goto(base + hash_)
                page.wait_for_selector(ready)
                page.wait_for_timeout(300)  # let the table's first refresh settle
                page.screenshot(path=OUT / f"{name}.png", full_page=True)
                print("wrote", OUT / f"{name}.png")
            browser.close()
        stop.set()
        worker.join(5)


if __name__ == "__main__":
    main()
