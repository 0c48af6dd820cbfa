"""A follower's side: the replication link to the leader (with its back-off after
failures and unanswered handshakes) and the proxies that pass clients on to the
leader."""

from __future__ import annotations

import asyncio
import logging
import time

from leveret.cluster.follower import (
    CopyFailed,
    Follower,
    NoWelcome,
    Refused,
    Silent,
    handshake_timeout,
)
from leveret.cluster.proxy import Proxy

log = logging.getLogger("leveret.cluster")


class FollowingMixin:
    """Part of `ClusterNode` (cluster/node.py), whose state it uses."""

    def _leader_port(self, kind: str) -> tuple[str, int] | None:
        leader = self.leader
        if leader is None or self.role != "follower":
            return None
        if kind in ("management", "prometheus"):
            port = leader.get(kind) or 0
        else:
            port = next((p for k, p in leader.get("amqp", []) if k == kind), 0)
        return (leader["host"], port) if port else None

    async def _start_proxies(self) -> None:
        if self._proxies:
            return
        c = self.config
        hold = 3.0 * self.ttl
        wanted = [(lst.host, lst.port, lst.kind) for lst in c.effective_listeners()]
        if c.management_port:
            wanted.append((c.host, c.management_port, "management"))
        if c.prometheus_port:
            wanted.append((c.host, c.prometheus_port, "prometheus"))
        for host, port, kind in wanted:
            proxy = Proxy(host, port, lambda k=kind: self._leader_port(k), hold, kind)
            for attempt in range(50):
                try:
                    await proxy.start()
                    break
                except OSError:
                    if attempt == 49:
                        raise
                    await asyncio.sleep(0.1)
            self._proxies.append(proxy)

    async def _stop_proxies(self) -> None:
        for proxy in self._proxies:
            await proxy.stop()
        self._proxies = []

    async def _follow_none(self) -> None:
        """No leader: keep the proxies (they hold new clients) and stop following."""
        self.role = "follower"
        await self._start_proxies()
        await self._stop_following()

    async def _follow(self) -> None:
        self.role = "follower"
        await self._start_proxies()
        leader = self.leader
        assert leader is not None
        if self.follower is not None and self.follower.epoch == self.epoch:
            if self._follow_task is not None and not self._follow_task.done():
                return
        await self._stop_following()
        if self._proxied_epoch != self.epoch:
            # Connections proxied to an older leader go; but not when the follower only
            # connects again to the same leader (its replication link failed or was cut):
            # its clients' connections to that leader are as good as ever.
            for proxy in self._proxies:
                proxy.drop_all()
            self._proxied_epoch = self.epoch
            # A new leader is tried at once, and again soon if it is still starting
            # (it refuses until its broker is up), whatever the last one cost.
            self._handshake_failures = 0
        self.follower = Follower(
            self.config.data_dir,
            self.name,
            self.config.cluster_name,
            leader,
            self.epoch,
            self.config.fsync != "never",
            self.local_status,
            handshake_timeout(self.ttl),
            self.config.workers,
        )
        self._follow_task = asyncio.ensure_future(self._run_follower(self.follower))

    async def _run_follower(self, follower: Follower) -> None:
        copy_failed = False
        why = ""  # why the handshake failed, for its log line
        try:
            await follower.run()
        except NoWelcome as exc:
            why = str(exc)
        except Refused as exc:
            if follower.welcomed:
                log.info("cluster: %s", exc)
            else:
                why = str(exc)
        except Silent as exc:
            log.warning(
                "cluster: %s heard %s: the link is dead; dropping it to connect again and "
                "sync what it lacks",
                self.name,
                exc,
            )
        except CopyFailed as exc:
            copy_failed = True
            log.warning("cluster: %s could not write its copy of the data dir: %s", self.name, exc)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            what = str(exc) or exc.__class__.__name__
            if follower.welcomed:
                log.info("cluster: link to leader %s: %s", follower.leader.get("node"), what)
            else:
                why = f"handshake with leader {follower.leader.get('node')}: {what}"
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("cluster: following %s failed", follower.leader.get("node"))
        if not follower.welcomed:
            await self._handshake_failed(follower, why or "the link closed")
            return
        self._handshake_failures = 0
        # A follower that keeps failing (its own disk full, say) backs off rather than
        # asking the leader for a snapshot five times a second. Only streaming resets
        # the count: a nearly full disk may take a small snapshot and fail at its next
        # write, and each time it went live it would hold the leader's confirms again
        # (and restart the leader's clock for taking it out of the in-sync set).
        if follower.streamed:
            self._follow_failures = 0  # it streamed: whatever ended it is a first failure
        if copy_failed or not follower.synced:
            self._follow_failures += 1
        elif not follower.streamed:
            self._follow_failures = 0  # synced, then the link ended (a new leader, say)
        pause = min(0.2 * 2 ** max(0, self._follow_failures - 1), 5.0)
        if copy_failed:
            log.warning("cluster: %s retries following in %.1f s", self.name, pause)
        await self._follow_again(follower, pause)

    async def _handshake_failed(self, follower: Follower, why: str) -> None:
        """No WELCOME: the leader was not reached, did not answer in time, or refused.

        That is the link's fault (or the leader's state), not this copy's, and cost the
        leader nothing (no snapshot was asked for), so it does not count towards the
        copy's back-off above. Attempts start at most every 0.2 s, doubling up to the
        handshake's own bound: one that timed out already waited that long and goes
        again at once, one refused at once does not spin. So a follower whose link
        healed is back within about one bound (0.8 lease) of the heal."""
        self._handshake_failures += 1
        n = self._handshake_failures
        spacing = min(0.2 * 2 ** (n - 1), follower.handshake)
        pause = max(0.0, spacing - follower.handshake_seconds)
        # A timeout is a partition's mark (warning); a refusal or a closed port is
        # what a leader starting, stopping or changing looks like (info).
        level = (
            logging.WARNING if follower.handshake_seconds >= follower.handshake else logging.INFO
        )
        # A partition may last hours: the first few failures, then one line a minute.
        now = time.monotonic()
        if n <= 3 or now - self._handshake_logged_at >= 60.0:
            self._handshake_logged_at = now
            log.log(
                level,
                "cluster: %s: %s; connecting again in %.1f s (%d in a row)",
                self.name,
                why,
                pause,
                n,
            )
        await self._follow_again(follower, pause)

    async def _follow_again(self, follower: Follower, pause: float) -> None:
        await asyncio.sleep(pause)
        self._changed.set()
        if self.follower is follower:
            self._follow_task = None  # the next step starts again

    async def _stop_following(self) -> None:
        task, follower = self._follow_task, self.follower
        self._follow_task = None
        self.follower = None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if follower is not None:
            await follower.close()
