"""The command line of a `leveret server` subprocess started by a test.

Every broker a test starts must take ports nobody else holds: people moving from
RabbitMQ run the suite on a machine where RabbitMQ already listens on 5672, 15672
and 15692, and two runs of the suite may share a machine.  So the HTTP and MQTT listeners a
test does not ask for are off (`0`); a test that wants one passes its own
`--management-port` or `--prometheus-port` after these, and argparse keeps the last.
"""

from __future__ import annotations

import sys

#: the listeners a test broker does not get unless the test names a port for them
QUIET_PORTS = (
    "--management-port", "0", "--prometheus-port", "0",
    "--mqtt-port", "0", "--web-mqtt-port", "0", "--mqtt-tls-port", "0",
)  # fmt: skip


def server_argv(*args: str) -> list[str]:
    """`python -m leveret server` with the HTTP listeners off, then ``args``."""
    return [sys.executable, "-m", "leveret", "server", *QUIET_PORTS, *args]
