"""The model's persistence: the broker's durability hooks, implemented on the store.

`store/` is a library of the disk (segment log, SQLite definitions, indexes) that
knows nothing of the model; `broker/durability.py` is the model's side, the hooks it
calls. This package joins the two: `durable_state.py`'s `DurableState` implements the
hooks with the store (definitions, messages, paging, recovery), and
`delayed_messages.py` keeps delayed exchanges' messages in the store's delay queue.
It is the only code that imports both `broker` and `store`'s internals to hold the
model's objects on disk.
"""
