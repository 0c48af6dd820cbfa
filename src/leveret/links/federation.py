"""Federation: upstreams, upstream sets and the links that policies ask for (placeholder)."""

from __future__ import annotations

from typing import Any


class Federation:
    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def upstreams_changed(self, vhost: str) -> None:
        return None

    def status(self) -> list[dict[str, Any]]:
        return []

    async def restart(self, vhost: str, link_id: str) -> bool:
        return False
