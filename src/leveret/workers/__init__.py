"""Building blocks for a broker made of worker processes.

One Python process runs one event loop on one core. To use more cores, the broker's
queues are to be shared out between worker processes, each with its own loop and
store, under a supervisor. This package holds the parts that arrangement rests on,
each usable and tested alone:

- `link`: the ordered, batched channel between two workers (records of publishes,
  settlements, credit and metadata changes; a socket pair under asyncio).
- `handoff`: moving a connected socket and its protocol state to another process.
- `affinity`: when a client connection moves to the worker that owns its queues,
  and the handoff channels it moves on (the one part here that reads AMQP events).
- `supervisor`: starting worker processes, restarting one that dies, stopping all.
- `count`: how many workers `--workers N|auto` runs (auto: the usable CPUs, or
  what the data dir was made with).
- `ring`: a shared-memory ring, the alternative to the socket pair that
  `bench/interworker.py` measures it against.

Nothing here knows the model or the AMQP codec: a message travels as the opaque
bytes its owner stores, so the wire has one codec (`protocol/`) and the disk one
format (`store/`).
"""
