"""The README's "Migrating from RabbitMQ with a shovel" commands, run as written.

A Leveret broker with queues and messages stands in for RabbitMQ (CI has none): the
commands are the README's, with its ports replaced by free ones and the new broker
stopped at the end. What must hold: the definitions arrive, every queue gets a running
shovel, every message is moved, clearing a shovel removes it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from links_support import api, count, free_port, leveret, publish, wait_for

README = Path(__file__).resolve().parents[2] / "README.md"


def migration_block() -> str:
    text = README.read_text()
    section = text.split("## Migrating from RabbitMQ with a shovel", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1)


@pytest.mark.leveret_only
def test_the_migration_commands_move_every_queue(tmp_path):
    with leveret() as old:
        for queue in ("orders", "invoices"):
            publish(old.url, queue, [b"%s %d" % (queue.encode(), i) for i in range(300)])
        port, mport = free_port(), free_port()
        old_mport = old.server.management.port
        script = migration_block()
        script = script.replace("15672", str(old_mport)).replace("5672", str(old.port))
        script = script.replace("15693", str(free_port()))
        script = script.replace("15673", str(mport)).replace("5673", str(port))
        script = script.replace("python -m leveret", f"{sys.executable} -m leveret")
        # Remember the server's pid (to stop it) and wait until its control socket answers.
        script = re.sub(
            r"(.* server .*)&\n",
            r"\1> server.log 2>&1 &\necho $! > server.pid\n"
            r"until " + re.escape(sys.executable) + r" -m leveret ctl list_vhosts >/dev/null 2>&1;"
            r" do sleep 0.2; done\n",
            script,
        )
        if shutil.which("curl") is None:
            script = script.replace(
                f"curl -u guest:guest http://127.0.0.1:{old_mport}/api/definitions -o rabbit.json",
                f'{sys.executable} -c "import urllib.request, base64; r = urllib.request.Request('
                f"'http://127.0.0.1:{old_mport}/api/definitions', headers={{'Authorization': "
                f"'Basic ' + base64.b64encode(b'guest:guest').decode()}}); "
                f"open('rabbit.json', 'wb').write(urllib.request.urlopen(r).read())\"",
            )
        # Step 5 is for later (after the move); it runs below for one queue.
        script, _, last = script.rpartition("\n# 5.")
        env = {**os.environ, "PYTHONPATH": str(README.parent / "src")}
        try:
            done = subprocess.run(
                ["bash", "-e", "-c", script],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            new_url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
            new_api = f"http://127.0.0.1:{mport}"
            for queue in ("orders", "invoices"):
                wait_for(lambda q=queue: count(new_url, q) == 300, 60, f"{queue} moved")
                assert count(old.url, queue) == 0
            states = {s["name"]: s["state"] for s in api(new_api, "GET", "/api/shovels")[1]}
            assert states == {"migrate-orders": "running", "migrate-invoices": "running"}
            assert "migrate-orders" in done.stdout  # step 4 printed the shovels
            clear = last.strip().splitlines()[-1].split("#")[0]
            cleared = subprocess.run(
                ["bash", "-c", clear],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cleared.returncode == 0, cleared.stderr
            names = [s["name"] for s in api(new_api, "GET", "/api/shovels")[1]]
            assert names == ["migrate-invoices"]
        finally:
            pid_file = tmp_path / "server.pid"
            if pid_file.exists():
                pid = int(pid_file.read_text())
                os.kill(pid, signal.SIGTERM)
                for _ in range(300):
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
