"""`python -m tests.partitions --seed N --minutes M`: a long partition schedule.

Prints the nemesis timeline as it goes and the report at the end (also written to
report.json in the run's directory, kept when the run fails or with --keep); exits 1
when the checker found anything, 2 when namespaces cannot be made here.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys

from . import nemeses
from .net import Unavailable
from .run import Run, format_report


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.partitions")
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--minutes", type=float, default=None, help="how long to inject faults")
    ap.add_argument("--events", type=int, default=None, help="or how many nemesis events")
    ap.add_argument("--lease", type=float, default=2.0, help="--cluster-lease-seconds")
    ap.add_argument("--hold", type=float, default=None, help="each fault's length in leases")
    ap.add_argument("--only", default=None, help=f"comma-separated of {','.join(nemeses.ALL)}")
    ap.add_argument(
        "--workers", type=int, default=1, help="each node's --workers (worker-pause needs 2+)"
    )
    ap.add_argument("--dir", default=None, help="where records and logs go")
    ap.add_argument("--keep", action="store_true", help="keep records and logs of a passed run")
    args = ap.parse_args()
    if args.minutes is None and args.events is None:
        args.minutes = 5
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    only = args.only.split(",") if args.only else None
    # a SIGTERM ends the run through its cleanup (namespaces, processes) like ^C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = Run(
            seed,
            minutes=args.minutes,
            events=args.events,
            lease=args.lease,
            only=only,
            directory=args.dir,
            keep=args.keep,
            hold=args.hold,
            workers=args.workers,
        ).run()
    except Unavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"python -m tests.partitions: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 1 if report["failures"] or report.get("slow") else 0


if __name__ == "__main__":
    sys.exit(main())
