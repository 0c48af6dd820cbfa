"""What the ctl area records: sequences of operator commands, run by rabbitmqctl against
the reference RabbitMQ and by `leveret ctl` against Leveret.

A step is (command, *arguments); a step whose command is a `list_*` is run twice, as a
table and with `--formatter json`. What is kept of each step (driver.observe): the exit
status, whether it failed, and for a listing its rows.
"""

from __future__ import annotations

#: the names the cases set; a listing keeps only these rows (and internal_cluster_id,
#: its value masked), since the reference may hold others
PREFIX = "ctlrec-"

CASES: dict[str, list[tuple[str, ...]]] = {
    "global_parameters.set_and_list": [
        ("set_global_parameter", "ctlrec-obj", '{"b": {"z": null, "c": 1}, "a": [1, "é"]}'),
        ("set_global_parameter", "ctlrec-num", "42"),
        ("set_global_parameter", "ctlrec-float", "1.5"),
        ("set_global_parameter", "ctlrec-str", '"text with spaces"'),
        ("set_global_parameter", "ctlrec-null", "null"),
        ("set_global_parameter", "ctlrec-bool", "true"),
        ("set_global_parameter", "ctlrec-list", '[1, "two"]'),
        ("list_global_parameters",),
        ("set_global_parameter", "ctlrec-num", '"changed"'),
        ("clear_global_parameter", "ctlrec-obj"),
        ("list_global_parameters",),
    ],
    "global_parameters.cluster_name": [
        ("set_cluster_name", "ctlrec cluster"),
        ("list_global_parameters",),
        ("set_global_parameter", "cluster_name", '"ctlrec by parameter"'),
        ("list_global_parameters",),
        ("clear_global_parameter", "cluster_name"),
        ("list_global_parameters",),
    ],
    "global_parameters.errors": [
        ("set_global_parameter", "ctlrec-bad", "{not json"),
        ("clear_global_parameter", "ctlrec-missing"),
        ("set_global_parameter", "ctlrec-no-value"),
        ("set_cluster_name",),
        ("clear_global_parameter",),
        ("list_global_parameters",),
    ],
}
