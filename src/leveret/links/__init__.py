"""Links to other brokers: shovels and federation, as RabbitMQ's plugins define them.

A *shovel* moves messages from a queue (or an exchange) on one broker to an
exchange or queue on another; a *federation link* makes an exchange or queue
here follow one on an upstream broker. Either may be this broker itself
(`amqp://` with no host). Both are built from the same part, `Forwarder`: a
consumer on one `leveret.client` connection joined to a confirm-publisher on
another, acking at the source only once the destination confirmed.

- `uris.py`: URIs read as RabbitMQ reads them (no host: this broker).
- `direct.py`: an in-memory transport that joins leveret.client to this broker.
- `validation.py`: the parameters' checks, in RabbitMQ's words (broker/erlang_terms.py
  writes the values in them).
- `headers.py`: x-shovelled, x-received-from and the other headers links write.
- `forwarder.py`: the consumer → publisher pipe with ack modes and flow control.
- `shovel.py`: a shovel's life (connect, declare, forward, delete-after, restart).
- `federation.py`, `exchange_link.py`, `queue_link.py`: upstreams and links.
- `manager.py`: starts and stops all of them as parameters, policies and
  topology change, and reports their status.

The definitions themselves are runtime parameters (broker.parameters).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from leveret.broker.broker import Broker


def register(broker: Broker) -> None:
    """Teach the model the components and policy keys these links act on."""
    from leveret.broker.policies import EXTRA_KEYS
    from leveret.links import validation

    broker.parameters.register("shovel", validation.shovel)
    broker.parameters.register("federation-upstream", validation.upstream)
    broker.parameters.register("federation-upstream-set", validation.upstream_set)
    for key in validation.POLICY_KEYS:
        EXTRA_KEYS[key] = validation.policy
