"""On-disk storage: durable definitions (SQLite) and persistent messages (segment log)."""

from leveret.store.committer import GroupCommitter
from leveret.store.definitions import (
    BindingDef,
    Definitions,
    DefinitionStore,
    ExchangeDef,
    QueueDef,
)
from leveret.store.errors import StoreError, StoreFormatError, StoreWriteError
from leveret.store.locations import Location
from leveret.store.message_store import MessageStore
from leveret.store.segments import SegmentLog

__all__ = [
    "BindingDef",
    "DefinitionStore",
    "Definitions",
    "ExchangeDef",
    "GroupCommitter",
    "Location",
    "MessageStore",
    "QueueDef",
    "SegmentLog",
    "StoreError",
    "StoreFormatError",
    "StoreWriteError",
]
