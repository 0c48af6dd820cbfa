"""The broker: virtual hosts and users, independent of any network code."""

from __future__ import annotations

from leveret.broker.direct_reply import DirectReplyRegistry
from leveret.broker.durability import DurabilityHooks
from leveret.broker.vhost import VirtualHost
from leveret.config import ServerConfig


class Broker:
    def __init__(self, config: ServerConfig, hooks: DurabilityHooks | None = None) -> None:
        self.config = config
        self.users = {config.default_user: config.default_pass}
        self.vhosts: dict[str, VirtualHost] = {"/": VirtualHost("/", hooks)}
        self.direct_reply = DirectReplyRegistry()

    def authenticate(self, username: str, password: str) -> bool:
        expected = self.users.get(username)
        return expected is not None and expected == password
