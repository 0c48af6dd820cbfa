"""The verdict of a run, from the clients' record files alone (`clients.py`).

For each queue, from what its publishers sent and its consumers got:
- lost: confirmed ("ok") and never delivered;
- phantom: delivered and never sent (no publisher recorded that message);
- duplicates: delivered more than once, where that is not allowed: a message
  confirmed once may come again only flagged redelivered (a stream, which has no
  such flag, only at the same offset: it was read again, not written again);
- order: per publisher, a message delivered (not redelivered) after one of that
  publisher's later messages;
- streams, by offset: a gap (an offset missing between the first and the last
  read), a rewrite (one offset read with two different messages), and a confirmed
  message at two offsets (written twice).
Unconfirmed ("unknown", or no outcome recorded) messages may be delivered or not,
once or more: only the above counts.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


def read(path: str) -> list[dict[str, Any]]:
    out = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a last line cut short by a kill
    return out


@dataclass
class Published:
    sent: dict[int, float] = field(default_factory=dict)  # seq → time sent
    outcome: dict[int, tuple[str, float]] = field(
        default_factory=dict
    )  # seq → (ok|nack|unknown, t)

    def confirmed(self) -> set[int]:
        return {s for s, (o, _) in self.outcome.items() if o == "ok"}


def publisher_log(path: str) -> Published:
    p = Published()
    for ev in read(path):
        if ev["e"] == "sent":
            p.sent[ev["seq"]] = ev["t"]
        elif ev["e"] in ("ok", "nack", "unknown"):
            p.outcome[ev["seq"]] = (ev["e"], ev["t"])
    return p


@dataclass
class QueueVerdict:
    queue: str
    kind: str
    sent: int = 0
    confirmed: int = 0
    nacked: int = 0
    unknown: int = 0
    delivered: int = 0
    lost: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    duplicates_allowed: int = 0
    order: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    rewrites: list[str] = field(default_factory=list)

    def failures(self) -> int:
        return sum(
            len(x)
            for x in (
                self.lost,
                self.phantom,
                self.duplicates,
                self.order,
                self.gaps,
                self.rewrites,
            )
        )

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "queue": self.queue,
            "kind": self.kind,
            "sent": self.sent,
            "confirmed": self.confirmed,
            "nacked": self.nacked,
            "unknown": self.unknown,
            "delivered": self.delivered,
            "duplicates_allowed": self.duplicates_allowed,
        }
        for name in ("lost", "phantom", "duplicates", "order", "gaps", "rewrites"):
            items = getattr(self, name)
            out[name] = len(items)
            if items:
                out[f"{name}_examples"] = items[:10]
        return out


def check_queue(
    queue: str, kind: str, publishers: dict[str, str], consumers: list[str]
) -> QueueVerdict:
    """`publishers`: name → record file; `consumers`: record files."""
    v = QueueVerdict(queue, kind)
    pubs = {name: publisher_log(path) for name, path in publishers.items()}
    for p in pubs.values():
        v.sent += len(p.sent)
        v.confirmed += len(p.confirmed())
        v.nacked += sum(1 for o, _ in p.outcome.values() if o == "nack")
        v.unknown += len(p.sent) - sum(1 for o, _ in p.outcome.values() if o in ("ok", "nack"))
    got: dict[str, int] = defaultdict(int)
    offsets: dict[int, str] = {}
    offsets_of: dict[str, set[int]] = defaultdict(set)
    last_seq: dict[str, int] = {}
    for path in consumers:
        for ev in read(path):
            if ev["e"] != "got":
                continue
            v.delivered += 1
            msg = ev["id"]
            name, _, seq_s = msg.partition(":")
            seq = int(seq_s) if seq_s.isdigit() else -1
            pub = pubs.get(name)
            if pub is None or seq not in pub.sent:
                v.phantom.append(msg)
                continue
            confirmed = pub.outcome.get(seq, ("", 0))[0] == "ok"
            if kind == "stream":
                off = ev.get("off")
                if not isinstance(off, int):
                    v.gaps.append(f"{msg} delivered with no offset")
                    continue
                if off in offsets:
                    if offsets[off] != msg:
                        v.rewrites.append(f"offset {off}: {offsets[off]} then {msg}")
                    continue  # the same offset read again
                offsets[off] = msg
                offsets_of[msg].add(off)
                if len(offsets_of[msg]) > 1:
                    if confirmed:
                        v.duplicates.append(f"{msg} at offsets {sorted(offsets_of[msg])}")
                    else:
                        v.duplicates_allowed += 1
                redelivered = False
            else:
                redelivered = bool(ev.get("r"))
                if got[msg] >= 1:
                    if confirmed and not redelivered:
                        v.duplicates.append(f"{msg} delivered again, not flagged redelivered")
                    else:
                        v.duplicates_allowed += 1
            got[msg] += 1
            if not redelivered and got[msg] == 1:
                if seq < last_seq.get(name, 0):
                    v.order.append(f"{msg} after {name}:{last_seq[name]}")
                last_seq[name] = max(seq, last_seq.get(name, 0))
    for name, p in pubs.items():
        for seq in sorted(p.confirmed()):
            if got.get(f"{name}:{seq}", 0) == 0:
                v.lost.append(f"{name}:{seq}")
    if kind == "stream" and offsets:
        lo, hi = min(offsets), max(offsets)
        missing = [o for o in range(lo, hi + 1) if o not in offsets]
        if missing:
            v.gaps.append(f"{len(missing)} offsets missing in {lo}..{hi}, first {missing[:5]}")
        if lo != 0:
            v.gaps.append(f"the stream read began at offset {lo}, not 0")
    return v


def confirm_times(publisher_paths: list[str]) -> list[float]:
    """When each confirm came (wall clock), in order."""
    return sorted(ev["t"] for path in publisher_paths for ev in read(path) if ev["e"] == "ok")


def confirm_gaps(publisher_paths: list[str], threshold: float = 1.0) -> list[tuple[float, float]]:
    """Periods of at least `threshold` s in which no publisher had a confirm: (start,
    length), in wall-clock time, to set against the nemesis timeline."""
    times = confirm_times(publisher_paths)
    return [(a, b - a) for a, b in zip(times, times[1:], strict=False) if b - a >= threshold]
