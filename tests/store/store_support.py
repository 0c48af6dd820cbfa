"""Helpers shared by the store tests."""

from __future__ import annotations

from pathlib import Path

from leveret.store import MessageStore


def _state(store: MessageStore, recovered: dict) -> dict:
    """Everything recovery decided, in comparable form."""
    queues = {}
    for key, paged in sorted(recovered.items()):
        rows = []
        for item in paged.export():
            seq, offs, sizes, flags = item
            for k in range(len(offs)):
                rows.append((seq, offs[k], sizes[k], flags[k] if flags is not None else 0))
        queues[key] = rows
    return {
        "queues": queues,
        "next_mid": store._next_mid,
        "live": {s: n for s, n in store._live.items()},
        "deps": {s: sorted(t) for s, t in store._deps.items() if t},
    }


def recovered_state(path: Path, segment_size: int) -> tuple[dict, dict]:
    """Recover, and stop before the store reclaims anything (which would change
    the data dir under the next comparison)."""
    store = MessageStore(str(path), segment_size=segment_size)
    store.prepare()
    recovered = store.recover()
    state = _state(store, recovered)
    how = dict(store.recovered_from)
    store._log.committer.close()  # type: ignore[union-attr]  # no clean index, no writes
    return state, how
