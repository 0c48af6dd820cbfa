"""A node's etcd lease: taken at registration, renewed every third of it, and the
deadline, on the monotonic clock, until which a leader may confirm (`lease_ok`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from leveret.cluster.etcd import EtcdError

log = logging.getLogger("leveret.cluster")


class LeaseMixin:
    """Part of `ClusterNode` (cluster/node.py), whose state it uses."""

    def lease_ok(self) -> bool:
        return time.monotonic() < self.confirm_deadline()

    def confirm_deadline(self) -> float:
        """Until when (time.monotonic()) this node may confirm as leader: the lease's
        deadline less a margin; 0 once the lease is lost. A node of workers sends it
        to its workers, which check it themselves (cluster/workertap.py)."""
        if self.lease_lost:
            return 0.0
        return self.lease_deadline - (0.05 + 0.1 * self.ttl)

    async def _register(self) -> bool:
        """Take a lease and write this node's keys; False if asked to stop first.

        etcd may be down for as long as an operator takes to notice, so the retries
        back off (0.5 s doubling to 5 s, one warning each) and a SIGTERM ends them,
        even in the middle of a request to an etcd that does not answer.
        """
        delay = 0.5
        while not self.stop_event.is_set():
            attempt = asyncio.ensure_future(self._register_once())
            stopping = asyncio.ensure_future(self.stop_event.wait())
            done, _ = await asyncio.wait({attempt, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if attempt not in done:
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                break
            try:
                attempt.result()
                return True
            except EtcdError as exc:
                log.warning(
                    "cluster: cannot register with etcd yet (retrying in %.1f s): %s", delay, exc
                )
            try:
                await asyncio.wait_for(self.stop_event.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, 5.0)
        return False

    async def _register_once(self) -> None:
        self.lease, self.ttl = await self.etcd.lease_grant(self.ttl)
        self.lease_deadline = time.monotonic() + self.ttl
        self.lease_lost = False
        info = json.dumps(self.info())
        await self.etcd.put(self.keys.nodes + self.name, info, self.lease)
        await self.etcd.put(self.keys.members + self.name, info)
        self.registered_at = time.monotonic()

    async def _keepalive(self) -> None:
        # Every third of the lease: a live leader may miss one renewal (a slow etcd, a
        # busy machine) and still confirm. (A dead leader is noticed a lease after its
        # last renewal, so renewing at half the lease would shorten failovers by about
        # 0.4 s with 5 s leases; tests with 1 s leases on a loaded machine then saw
        # leaders step down for one late answer.)
        while True:
            interval = self.ttl / 3
            sent = time.monotonic()
            try:
                ttl = await self.etcd.lease_keepalive(self.lease, timeout=interval)
            except EtcdError as exc:
                log.debug("lease renewal failed: %s", exc)
                ttl = None
            if ttl == 0:
                log.warning("cluster: lease expired in etcd")
                self.lease_lost = True
                self._changed.set()
                if self.role != "leader":
                    await self._register()
                    continue
            elif ttl:
                self.lease_deadline = sent + ttl
            elif time.monotonic() > self.lease_deadline:
                self._changed.set()
            if self.tap is not None:
                self.tap.check()
            if self.relay is not None:
                self.relay.renewed()  # the workers' held confirms may use the new deadline
            await asyncio.sleep(max(0.05, interval - (time.monotonic() - sent)))
