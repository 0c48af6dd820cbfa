"""A broker's workers without their processes: N launcher Nodes on one event loop
(a background thread), each with its own store directory and AMQP port, linked by a
full mesh of real socket pairs (leveret.workers.mesh.local_meshes).

What crosses between workers (metadata, routed publishes, deliveries, acks) crosses
here exactly as between processes, so tests of it can use any client against any
worker's port; only the processes, the supervisor and the shared listening port are
missing (the tests of `leveret server --workers` have those).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from leveret.config import ServerConfig
from leveret.launcher import Node
from leveret.workers.mesh import Mesh, local_meshes

T = TypeVar("T")


class InProcessWorkers:
    """`nodes[i]` is worker i; `port(i)` its AMQP port; `call(fn)` runs on their loop."""

    def __init__(
        self,
        count: int,
        data_dir: Path | None,
        per_worker: dict[int, dict[str, Any]] | None = None,
        affinity: bool = False,
        **config: Any,
    ) -> None:
        self.count = count
        # connections move to the worker that owns their queue (workers/affinity.py),
        # over a handoff socket pair per pair of workers as the supervisor makes them
        self.affinity = affinity
        self.handoffs: list[Any] = []
        self.data_dir = data_dir
        self.config = config
        # options for one worker only: {0: {"management_port": 0}}, as v1 runs the
        # management API on worker 0 alone
        self.per_worker = per_worker or {}
        self.loop = asyncio.new_event_loop()
        self.nodes: list[Node] = []
        self.meshes: list[Mesh] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def worker_config(self, index: int) -> ServerConfig:
        base = ServerConfig(port=0, persistence=self.data_dir is not None)
        options: dict[str, Any] = {**self.config, **self.per_worker.get(index, {})}
        if self.data_dir is not None:
            options["data_dir"] = str(self.data_dir / f"worker-{index}")
        return replace(base, **options)

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        async def wrapped() -> T:
            return fn(*args)

        return self.run(wrapped())

    def start(self) -> InProcessWorkers:
        async def go() -> None:
            self.meshes = await local_meshes(self.count)
            for i in range(self.count):
                node = Node(self.worker_config(i), loop=self.loop, mesh=self.meshes[i])
                self.nodes.append(node)
            await asyncio.gather(*(n.start() for n in self.nodes))
            if self.affinity:
                self._arm_handoffs()

        self.run(go())
        return self

    def _arm_handoffs(self) -> None:
        import socket

        from leveret.workers.affinity import Handoffs

        self.handoffs = [
            Handoffs(m, n.listener.adopt) for m, n in zip(self.meshes, self.nodes, strict=True)
        ]
        for i in range(self.count):
            for j in range(i + 1, self.count):
                a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                self.handoffs[i].attach(j, a)
                self.handoffs[j].attach(i, b)
        for node, handoffs in zip(self.nodes, self.handoffs, strict=True):
            node.listener.handoffs = handoffs

    def port(self, index: int) -> int:
        return self.nodes[index].port

    def url(self, index: int) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port(index)}/%2F"

    def stop(self) -> None:
        async def go() -> None:
            for handoffs in self.handoffs:
                handoffs.close()
            for node in self.nodes:
                await node.stop()
            for mesh in self.meshes:
                mesh.close()

        try:
            self.run(go())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


@contextmanager
def in_process_workers(
    count: int = 2,
    data_dir: Path | None = None,
    per_worker: dict[int, dict[str, Any]] | None = None,
    affinity: bool = False,
    **config: Any,
) -> Iterator[InProcessWorkers]:
    workers = InProcessWorkers(count, data_dir, per_worker, affinity, **config).start()
    try:
        yield workers
    finally:
        workers.stop()
