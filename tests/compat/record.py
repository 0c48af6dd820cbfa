"""Run every area's recorder against the reference RabbitMQ.

    python -m tests.compat.record --rabbitmq amqp://guest:guest@127.0.0.1:5677/%2F \
        --management http://127.0.0.1:15677 [--area http --area access ...]

An area is a subpackage of tests/compat with a `record` module whose `main(argv)`
takes the same --rabbitmq/--management arguments (common.recorder_args) and writes
that area's recordings. Areas are found by looking, so a new one needs no line here.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def areas() -> list[str]:
    return sorted(
        p.parent.name for p in HERE.glob("*/record.py") if (p.parent / "__init__.py").exists()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rabbitmq", required=True)
    parser.add_argument("--management", required=True)
    parser.add_argument("--area", action="append", choices=areas(), help="default: all")
    args = parser.parse_args(argv)
    failed = []
    for area in args.area or areas():
        print(f"== {area}", flush=True)
        module = importlib.import_module(f"{__package__ or 'tests.compat'}.{area}.record")
        code = module.main(["--rabbitmq", args.rabbitmq, "--management", args.management])
        if code:
            failed.append(area)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
