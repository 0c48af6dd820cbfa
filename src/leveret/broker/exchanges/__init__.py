"""Exchange types by name. A new exchange type is a new module plus a line here."""

from leveret.broker.exchanges.base import ExchangeType
from leveret.broker.exchanges.consistent_hash import ConsistentHashExchange
from leveret.broker.exchanges.deduplication import DeduplicationExchange
from leveret.broker.exchanges.delayed import DelayedMessageExchange
from leveret.broker.exchanges.direct import DirectExchange
from leveret.broker.exchanges.fanout import FanoutExchange
from leveret.broker.exchanges.federation_upstream import FederationUpstreamExchange
from leveret.broker.exchanges.headers import HeadersExchange
from leveret.broker.exchanges.topic import TopicExchange

EXCHANGE_TYPES: dict[str, type[ExchangeType]] = {
    cls.name: cls
    for cls in (
        DirectExchange,
        FanoutExchange,
        TopicExchange,
        HeadersExchange,
        ConsistentHashExchange,
        DeduplicationExchange,
        FederationUpstreamExchange,
        DelayedMessageExchange,
    )
}

__all__ = ["EXCHANGE_TYPES", "ExchangeType"]
