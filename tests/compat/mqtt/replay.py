"""Replay the recorded MQTT scenarios and list the differences from the recordings.

    python -m tests.compat.mqtt.replay [--target leveret|rabbitmq] [--all] [--only GLOB]

`--target leveret` (the default) starts `python -m leveret server` with its MQTT
listener on free ports, as the CI test does; `--target rabbitmq` runs the same
scenarios against the reference again (`--mqtt-port`, `--amqp-port`,
`--management` as for the recorder), which shows that a scenario's observations are
stable: no difference is expected there. `--all` also prints the differences the
allow-list allows; the summary counts identical and different scenarios.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from pathlib import Path
from typing import Any

from ..common import Difference, read_json, split_allowed
from .allowed import ALLOWED
from .scenarios import SCENARIOS, about
from .target import Target, leveret, rabbitmq

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def recording(name: str) -> dict[str, Any]:
    return read_json(RECORDINGS / f"{name}.json")


def differences(case: str, expected: Any, actual: Any, path: str = "observed") -> list:
    """Every leaf where `actual` is not `expected`: a key one side lacks, a list of
    another length, another value."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for key in sorted(expected.keys() | actual.keys()):
            sub = f"{path}.{key}"
            if key not in actual:
                out.append(Difference(case, "missing", sub, expected[key], None))
            elif key not in expected:
                out.append(Difference(case, "extra", sub, None, actual[key]))
            else:
                out += differences(case, expected[key], actual[key], sub)
        return out
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        out = []
        for item_e, item_a in zip(expected, actual, strict=True):
            out += differences(case, item_e, item_a, path + "[]")
        return out
    if expected == "$volatile" or actual == "$volatile":
        return []
    if expected != actual or type(expected) is not type(actual):
        return [Difference(case, "value", path, expected, actual)]
    return []


def normalised(value: Any) -> Any:
    """As JSON has it (tuples become lists), as the recording was written."""
    import json

    return json.loads(json.dumps(value))


def replay_case(target: Target, name: str) -> list[Difference]:
    record = recording(name)
    diffs = []
    if record["about"] != about(name):
        diffs.append(Difference(name, "value", "about", record["about"], about(name)))
    return diffs + differences(name, record["observed"], normalised(SCENARIOS[name](target)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=["leveret", "rabbitmq"], default="leveret")
    parser.add_argument("--mqtt-port", type=int, default=1884, help="rabbitmq target")
    parser.add_argument("--amqp-port", type=int, default=5673, help="rabbitmq target")
    parser.add_argument("--web-mqtt-port", type=int, default=15675, help="rabbitmq target")
    parser.add_argument("--management", default="http://127.0.0.1:15673", help="rabbitmq")
    parser.add_argument("--all", action="store_true", help="print allowed differences too")
    parser.add_argument("--only", help="scenarios matching this glob")
    args = parser.parse_args(argv)
    names = [n for n in SCENARIOS if not args.only or fnmatch.fnmatchcase(n, args.only)]
    diffs: list[Difference] = []

    def run(target: Target) -> None:
        for name in names:
            found = replay_case(target, name)
            print(f"{name}: {'same' if not found else f'{len(found)} differences'}",
                  file=sys.stderr, flush=True)  # fmt: skip
            diffs.extend(found)

    if args.target == "rabbitmq":
        run(rabbitmq(args.mqtt_port, args.amqp_port, args.management, args.web_mqtt_port))
    else:
        with leveret() as target:
            run(target)
    left, _used = split_allowed(diffs, ALLOWED if args.target == "leveret" else [])
    for diff in diffs if args.all else left:
        print(diff)
    differing = {d.case for d in diffs}
    print(
        f"{len(names)} scenarios on {args.target}: {len(names) - len(differing)} identical, "
        f"{len(differing)} different ({len({d.case for d in left})} not allowed)"
    )
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
