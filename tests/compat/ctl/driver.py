"""Runs a case's steps with some operator command and keeps what a script sees.

`run(argv)` runs one step's arguments, the same for both: `rabbitmqctl ARGV` for the
recording, `leveret ctl --data-dir D ARGV` (or `--url U`) for the replay. ARGV is
`-q COMMAND ARGS...`, and `--formatter json` after them for a listing's JSON. Kept per step: the exit status (`exit`),
whether it failed (`failed`), the standard output of a change (`stdout`), and for a
listing, table and JSON, the rows the cases made (cases.PREFIX, cluster_name) plus
internal_cluster_id with its value masked, sorted (rabbitmqctl lists in its table's
order). Error texts are not kept: Leveret words its own (test_ctl_global_parameters).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

from ..common import VOLATILE
from .cases import PREFIX

Runner = Callable[[list[str]], subprocess.CompletedProcess]


def _kept(name: str) -> bool:
    return name.startswith(PREFIX) or name in ("cluster_name", "internal_cluster_id")


def _masked(name: str, value: str) -> str:
    if name != "internal_cluster_id":
        return value
    return f'"{VOLATILE}"' if value.startswith('"') and value.endswith('"') else value


def observe(steps: list[tuple[str, ...]], run: Runner) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for step in steps:
        command, *args = step
        if not command.startswith("list_"):
            done = run(["-q", command, *args])
            records.append(
                {
                    "step": " ".join(step),
                    "exit": done.returncode,
                    "failed": done.returncode != 0,
                    "stdout": done.stdout,
                }
            )
            continue
        table = run(["-q", command, *args])
        lines = table.stdout.splitlines()
        rows = []
        for line in lines[1:]:
            name, _, value = line.partition("\t")
            if _kept(name):
                rows.append(f"{name}\t{_masked(name, value)}")
        records.append(
            {
                "step": " ".join(step),
                "exit": table.returncode,
                "failed": table.returncode != 0,
                "header": lines[0] if lines else "",
                "rows": sorted(rows),
            }
        )
        js = run(["-q", command, *args, "--formatter", "json"])
        items = json.loads(js.stdout) if js.returncode == 0 else []
        records.append(
            {
                "step": " ".join(step) + " --formatter json",
                "exit": js.returncode,
                "failed": js.returncode != 0,
                "fields": sorted({",".join(sorted(item)) for item in items}),
                "rows": sorted(
                    [item["name"], _masked(item["name"], item["value"])]
                    for item in items
                    if _kept(item["name"])
                ),
            }
        )
    return records
