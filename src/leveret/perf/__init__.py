"""`leveret perf`: a PerfTest-style load generator for AMQP 0-9-1 brokers.

Entry points for the CLI wiring: `add_arguments(parser)` adds the flags to a subcommand
parser, `run(args)` performs the run and returns the exit code; `main(argv)` serves
`python -m leveret.perf`. Exit codes: 0 ok, 1 connection failure or broker error,
2 bad flags (argparse), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys

from leveret.perf.options import add_arguments, validate

__all__ = ["add_arguments", "main", "run"]


def run(args: argparse.Namespace) -> int:
    """Run one benchmark described by parsed `args`; prints the summary, returns exit code."""
    from leveret.perf.runner import execute
    from leveret.perf.stats import human_summary

    address, queues = validate(args)
    result = execute(args, address, queues)
    started = result["window_s"] > 0 or bool(result["timeline"])
    if args.json:
        print(json.dumps(result), flush=True)
    elif started:
        print(human_summary(result), flush=True)
    for err in result["errors"]:
        print(f"leveret perf: error: {err}", file=sys.stderr, flush=True)
    if result["errors"]:
        return 1
    if any(n.startswith("interrupted") for n in result["notes"]):
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="leveret perf",
        description="Load generator for AMQP 0-9-1 brokers (in the spirit of RabbitMQ PerfTest).",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
