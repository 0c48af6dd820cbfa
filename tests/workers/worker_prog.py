"""A worker process for the supervisor's tests: `worker_prog.py DIR [exit CODE]`.

It writes `DIR/started-<index>-<pid>` once it runs and `DIR/stopped-<index>-<pid>`
when SIGTERM comes (then exits 0), so a test sees that the supervisor started it,
forwarded the signal, and whose process each was. With `exit CODE` it exits at once
with that status instead: a worker that cannot stay up."""

from __future__ import annotations

import os
import signal
import sys
import time

directory = sys.argv[1]
index = os.environ["LEVERET_WORKER_INDEX"]
if len(sys.argv) > 3 and sys.argv[2] == "exit":
    sys.exit(int(sys.argv[3]))


def on_term(signum: int, frame: object) -> None:
    with open(os.path.join(directory, f"stopped-{index}-{os.getpid()}"), "w"):
        pass
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(directory, f"started-{index}-{os.getpid()}"), "w"):
    pass
while True:
    time.sleep(3600)
