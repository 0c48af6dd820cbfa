"""Runs this broker's shovels and federation links, and reports on them.

The launcher makes one LinkManager per node once its store is open and starts
it after the node listens (links to `amqp://` go through the direct transport, and wait like
any client while stored messages are read back). The manager follows the
runtime parameters (a shovel set, changed or cleared; an upstream or set
changed), the policies and the topology (federation), and keeps what the
status endpoints, the UI and Prometheus show: state, reason, and the messages
each link moved since the broker started.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from leveret.broker.errors import InvalidValue, NotFound
from leveret.client.connection import Connection, connect
from leveret.client.url import ConnectionParameters
from leveret.links import direct
from leveret.links.shovel import Shovel
from leveret.links.uris import LinkURI

if TYPE_CHECKING:
    from leveret.handle import NodeHandle

log = logging.getLogger("leveret.links")

NODE = "leveret@localhost"  # the node name the management API shows (routes.common.NODE)


class LinkManager:
    def __init__(self, node: NodeHandle) -> None:
        self.node = node
        self.broker = node.broker
        self.shovels: dict[tuple[str, str], Shovel] = {}
        # ("shovel", vhost, name) / ("federation", vhost, kind, name, upstream) →
        # messages moved since this broker started (links that went keep their count)
        self.moved: dict[tuple[str, ...], int] = {}
        self.federation: Any = None  # leveret.links.federation.Federation
        self._started = False

    @property
    def cluster_name(self) -> str:
        return self.broker.cluster_name

    # --- life ---------------------------------------------------------------------

    async def start(self) -> None:
        from leveret.links.federation import Federation

        self._started = True
        self.broker.parameters.listeners.append(self._parameter_changed)
        for name, value in sorted(self.node.config.shovels.items()):
            self._start_shovel("/", name, value, "static")
        for (vhost, component, name), value in sorted(self.broker.parameters.values.items()):
            if component == "shovel":
                self._start_shovel(vhost, name, value)
        self.federation = Federation(self)
        self.federation.start()

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._parameter_changed in self.broker.parameters.listeners:
            self.broker.parameters.listeners.remove(self._parameter_changed)
        shovels = list(self.shovels.values())
        if self.federation is not None:
            await self.federation.stop()
        await asyncio.gather(*(s.stop() for s in shovels), return_exceptions=True)

    def _parameter_changed(self, vhost: str, component: str, name: str, value: Any) -> None:
        if not self._started:
            return
        if component == "shovel":
            old = self.shovels.pop((vhost, name), None)
            if old is not None:
                stopping = asyncio.ensure_future(old.stop())
            else:
                stopping = None
            if value is not None:
                if stopping is not None:
                    # The old one lets go of its connections before the new one starts.
                    stopping.add_done_callback(
                        lambda _f: (
                            self._start_shovel(vhost, name, value)
                            if (vhost, name) not in self.shovels
                            and self.broker.parameters.values.get((vhost, "shovel", name)) == value
                            else None
                        )
                    )
                else:
                    self._start_shovel(vhost, name, value)
        elif component.startswith("federation") and self.federation is not None:
            self.federation.upstreams_changed(vhost)

    def _start_shovel(
        self, vhost: str, name: str, value: dict[str, Any], kind: str = "dynamic"
    ) -> None:
        if not self._started:
            return  # stopped meanwhile (an old shovel was stopping to make room)
        shovel = Shovel(self, vhost, name, value, kind)
        self.shovels[(vhost, name)] = shovel
        shovel.start()

    def shovel_completed(self, shovel: Shovel) -> None:
        """src-delete-after reached: the shovel and its definition go (RabbitMQ's autodelete)."""
        key = (shovel.vhost, shovel.name)
        if self.shovels.get(key) is shovel:
            del self.shovels[key]
        if shovel.kind == "dynamic" and (shovel.vhost, "shovel", shovel.name) in (
            self.broker.parameters.values
        ):
            self.broker.parameters.clear(shovel.vhost, "shovel", shovel.name)

    async def restart_shovel(self, vhost: str, name: str) -> bool:
        shovel = self.shovels.get((vhost, name))
        if shovel is None:
            return False
        log.info("shovel '%s' in vhost '%s' will be restarted", name, vhost)
        await shovel.restart()
        return True

    def restart_shovel_now(self, vhost: str, name: str) -> None:
        """For callers without a loop to await on (leveret ctl): NotFound if unknown."""
        if (vhost, name) not in self.shovels:
            raise NotFound(f"shovel '{name}' in vhost '{vhost}' does not exist")
        asyncio.ensure_future(self.restart_shovel(vhost, name))

    def delete_shovel(self, vhost: str, name: str) -> None:
        shovel = self.shovels.get((vhost, name))
        if shovel is None:
            raise NotFound(f"shovel '{name}' in vhost '{vhost}' does not exist")
        if shovel.kind == "static":
            raise InvalidValue(
                f"shovel '{name}' is static (from the config file): it cannot be deleted"
            )
        self.broker.parameters.clear(vhost, "shovel", name)

    # --- status -----------------------------------------------------------------------

    def shovel_status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return [
            s.status(NODE)
            for key, s in sorted(self.shovels.items())
            if vhost is None or s.vhost == vhost
        ]

    def count_moved(self, key: tuple[str, ...], n: int) -> None:
        """("shovel", vhost, name) or ("federation", vhost, kind, name, upstream)."""
        self.moved[key] = self.moved.get(key, 0) + n

    # --- connections -------------------------------------------------------------------

    async def connect(
        self, uri: LinkURI, name: str, reconnect_delay: float, properties: dict | None = None
    ) -> Connection:
        """A leveret.client connection for a link: to another broker, or to this one.

        leveret.client's recovery rides out short outages (same URI); after
        a few failed reconnects it gives up and the link's own loop starts over.
        """
        params: ConnectionParameters
        if uri.direct:
            params = ConnectionParameters(
                hosts=(("leveret-direct", 0),),
                username=uri.username or "none",
                password=uri.password or "",
                vhost=uri.vhost,
                connector=partial(self._open_direct, user=uri.username),
            )
        else:
            assert uri.params is not None
            params = uri.params
        delay = max(float(reconnect_delay or 1), 0.1)
        return await connect(
            params,
            name=name,
            recovery=bool(reconnect_delay),
            reconnect_delay=min(delay, 1.0),
            reconnect_max_delay=max(delay, 1.0),
            reconnect_attempts=3,
            client_properties=properties,
        )

    async def _open_direct(
        self, protocol_factory: Callable[[], Any], host: str, port: int, *, user: str | None
    ) -> Any:
        if not self._started:  # a link reconnecting while the broker stops
            raise ConnectionRefusedError("the broker is stopping")
        return await direct.open_connection(self.node.listener, protocol_factory, user)
