"""Helpers every area of the recorded differential suite shares.

The suite records what RabbitMQ 3.10 answers and compares Leveret's answer with it.
A recording keeps, per case, the *shape* of each answer (field names and JSON types,
recursively) and its *values* with the volatile ones masked (rates, timestamps,
memory, ports: whatever differs between two runs of the same broker). Comparing two
recordings gives a list of `Difference`s; an area's allow-list (`allowed.py`, a list of
`Allowed`) names the ones that are deliberate, each with its anchor in
docs/differences.md, which `missing_anchors` checks.

Small API on purpose:

- `shape(value)`, `masked(value, volatile, variables)`: what to record;
- `compare(case, expected, actual)`: the differences between two records;
- `Allowed`, `split_allowed(diffs, allowed)`: the allow-list;
- `missing_anchors(allowed)`: allow-list anchors not found in docs/differences.md;
- `recorder_args(argv)`, `write_json`, `read_json`: the recorders' command line and files.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DIFFERENCES_MD = ROOT / "docs" / "differences.md"

#: what a masked value is replaced by in a recording: its type is still compared
VOLATILE = "$volatile"
#: the shape of an HTTP answer with no body (204)
EMPTY = "empty"


# --- shapes ------------------------------------------------------------------------------


def json_type(value: Any) -> str:
    """JSON's type of a decoded value: JSON has one number type, so 1 and 1.0 agree."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {value!r}")


def shape(value: Any) -> Any:
    """Field names and JSON types, recursively.

    An object's shape is an object of its fields' shapes; an array's is a one-item
    array of its items' merged shape (`[]` when empty); a scalar's is its type name.
    Items of one array are merged: an object field present in some items only is kept,
    and unlike types become "a|b" (so a list of queues where only some have
    `message_stats` still has one shape).
    """
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        if not value:
            return []
        merged = shape(value[0])
        for item in value[1:]:
            merged = merge_shapes(merged, shape(item))
        return [merged]
    return json_type(value)


def merge_shapes(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {
            k: merge_shapes(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k))
            for k in sorted(a.keys() | b.keys())
        }
    if isinstance(a, list) and isinstance(b, list):
        if not a or not b:
            return a or b
        return [merge_shapes(a[0], b[0])]
    if a == b:
        return a
    kinds = set(_type_names(a)) | set(_type_names(b))
    return "|".join(sorted(kinds))


def _type_names(s: Any) -> list[str]:
    if isinstance(s, dict):
        return ["object"]
    if isinstance(s, list):
        return ["array"]
    return s.split("|")


# --- masking -----------------------------------------------------------------------------


def masked(
    value: Any,
    volatile: Iterable[str] = (),
    variables: dict[str, Any] | None = None,
    _path: str = "",
) -> Any:
    """`value` with volatile leaves replaced by VOLATILE and known run-specific strings by
    their variable names.

    `volatile` holds field names, with `*` if need be (`uptime`, `io_*`: any field of
    that name at any depth), or paths with `.` or `[]` (`listeners[].port`,
    `*.exchange_types[].description`) matched against the field's path. `variables` maps a name to a value seen in this run (the node name, a
    connection's name with its ephemeral port): every string equal to or containing it
    has it replaced by `{name}`, so two runs compare equal.
    """
    volatile = tuple(volatile)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            path = f"{_path}.{key}" if _path else key
            if _is_volatile(key, path, volatile):
                out[key] = VOLATILE
            else:
                out[key] = masked(item, volatile, variables, path)
        return out
    if isinstance(value, list):
        return [masked(item, volatile, variables, f"{_path}[]") for item in value]
    if isinstance(value, str) and variables:
        for name, seen in sorted(variables.items(), key=lambda kv: -len(str(kv[1]))):
            if seen is not None and str(seen) and str(seen) in value:
                value = value.replace(str(seen), "{" + name + "}")
    return value


def named_keys(value: Any, variables: dict[str, Any]) -> Any:
    """`value` with run-specific strings in object *keys* replaced by `{name}` (RabbitMQ
    keys some objects by node name: a vhost's `cluster_state`), so shapes compare too."""
    if isinstance(value, dict):
        return {_named(k, variables): named_keys(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [named_keys(v, variables) for v in value]
    return value


def _named(key: str, variables: dict[str, Any]) -> str:
    for name, seen in sorted(variables.items(), key=lambda kv: -len(str(kv[1]))):
        if seen is not None and str(seen) and str(seen) in key:
            key = key.replace(str(seen), "{" + name + "}")
    return key


def sorted_lists(value: Any, fields: Iterable[str], _path: str = "") -> Any:
    """`value` with the arrays at `fields` (names or paths, as `masked` takes them; ""
    for the answer itself) in a canonical order: where RabbitMQ's order is a hash table's (definitions' lists,
    a node's exchange types), order carries no meaning and is not compared."""
    fields = tuple(fields)
    if not _path and "" in fields and isinstance(value, list):  # "": the answer itself
        return sorted(sorted_lists(value, fields, "[]"), key=_canonical)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            path = f"{_path}.{key}" if _path else key
            item = sorted_lists(item, fields, path)
            if isinstance(item, list) and _is_volatile(key, path, fields):
                item = sorted(item, key=_canonical)
            out[key] = item
        return out
    if isinstance(value, list):
        return [sorted_lists(item, fields, f"{_path}[]") for item in value]
    return value


def _canonical(item: Any) -> tuple[str, str]:
    """Objects by their name first (what a reader looks for), then by all they hold."""
    name = item.get("name") if isinstance(item, dict) else None
    return (name if isinstance(name, str) else "", json.dumps(item, sort_keys=True))


def _is_volatile(key: str, path: str, volatile: tuple[str, ...]) -> bool:
    for rule in volatile:
        if "." in rule or "[" in rule:
            if fnmatch.fnmatchcase(path, rule):
                return True
        elif fnmatch.fnmatchcase(key, rule):
            return True
    return False


# --- differences -------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One way an answer differs from the recorded one.

    kind: "status" (HTTP status or reply code), "missing" (a field RabbitMQ has),
    "extra" (a field RabbitMQ does not have), "type" (the same field, another JSON
    type), "value" (a non-volatile value).
    """

    case: str
    kind: str
    path: str
    expected: Any = None
    actual: Any = None

    def __str__(self) -> str:
        where = f"{self.case} {self.kind} {self.path or '(top)'}"
        return f"{where}: expected {self.expected!r}, got {self.actual!r}"


def compare(case: str, expected: dict[str, Any], actual: dict[str, Any]) -> list[Difference]:
    """Differences between two records of one case.

    A record is a dict with any of `status` (compared as a value), `shape` (compared
    field by field: missing, extra, type) and `body` (masked values, compared where
    neither side is VOLATILE and the shapes agree). Other keys are compared as values.
    """
    out: list[Difference] = []
    for key in expected.keys() | actual.keys():
        if key in ("shape", "body"):
            continue
        if expected.get(key) != actual.get(key):
            out.append(Difference(case, key, "", expected.get(key), actual.get(key)))
    if "shape" in expected or "shape" in actual:
        _shape_diff(case, expected.get("shape"), actual.get("shape"), "", out)
    if "body" in expected or "body" in actual:
        _value_diff(case, expected.get("body"), actual.get("body"), "", out)
    return sorted(out, key=lambda d: (d.kind, d.path))


def _shape_diff(case: str, a: Any, b: Any, path: str, out: list[Difference]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            sub = f"{path}.{key}" if path else key
            if key not in b:
                out.append(Difference(case, "missing", sub, a[key], None))
            elif key not in a:
                out.append(Difference(case, "extra", sub, None, b[key]))
            else:
                _shape_diff(case, a[key], b[key], sub, out)
    elif isinstance(a, list) and isinstance(b, list):
        if a and b:
            _shape_diff(case, a[0], b[0], path + "[]", out)
        elif a and not b and isinstance(a[0], dict):
            # An empty list where RabbitMQ has items: its items' fields are unknown here;
            # the values compare (below) reports the length.
            return
    elif a != b and not _one_of(b, a):
        out.append(Difference(case, "type", path, _brief(a), _brief(b)))


def _one_of(b: Any, a: Any) -> bool:
    """Whether shape `b` is one of the types a merged shape `a` ("array|object") allows:
    RabbitMQ's items of one list may differ in type (a listener's `socket_opts` is an
    object or an empty list); an answer whose items all have one of them is one
    RabbitMQ could give."""
    return isinstance(a, str) and "|" in a and set(_type_names(b)) <= set(a.split("|"))


def _value_diff(case: str, a: Any, b: Any, path: str, out: list[Difference]) -> None:
    if a == VOLATILE or b == VOLATILE:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() & b.keys()):
            _value_diff(case, a[key], b[key], f"{path}.{key}" if path else key, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(Difference(case, "value", path, _brief(a), _brief(b)))
        else:
            for x, y in zip(a, b, strict=True):
                _value_diff(case, x, y, path + "[]", out)
    elif json_type(a) == json_type(b) and a != b:
        out.append(Difference(case, "value", path, a, b))


def _brief(value: Any) -> Any:
    if isinstance(value, list):
        return f"array of {len(value)}"
    if isinstance(value, dict):
        return "object"
    return value


# --- allow-list --------------------------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """A deliberate difference: `case` and `path` are fnmatch patterns ("queues.get*",
    "*.message_stats"), `kind` one of Difference's kinds or "*", `anchor` the entry in
    docs/differences.md ("differences.md#http-product-name"), `reason` why users would
    accept it."""

    case: str
    kind: str
    path: str
    anchor: str
    reason: str

    def matches(self, diff: Difference) -> bool:
        return (
            fnmatch.fnmatchcase(diff.case, self.case)
            and (self.kind == "*" or self.kind == diff.kind)
            and fnmatch.fnmatchcase(diff.path, self.path)
        )


def split_allowed(
    diffs: Iterable[Difference], allowed: Iterable[Allowed]
) -> tuple[list[Difference], set[Allowed]]:
    """(differences no entry allows, the entries that allowed at least one)."""
    allowed = list(allowed)
    left, used = [], set()
    for diff in diffs:
        hits = [a for a in allowed if a.matches(diff)]
        if hits:
            used.update(hits)
        else:
            left.append(diff)
    return left, used


def doc_anchors(path: Path = DIFFERENCES_MD) -> set[str]:
    """Anchors of a Markdown file: GitHub's heading slugs and explicit `<a id="...">`."""
    text = path.read_text()
    anchors = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    for heading in re.findall(r"^#+\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def missing_anchors(allowed: Iterable[Allowed], path: Path = DIFFERENCES_MD) -> list[str]:
    """Allow-list anchors (`differences.md#x`) that docs/differences.md does not have."""
    anchors = doc_anchors(path)
    out = []
    for entry in allowed:
        doc, _, anchor = entry.anchor.partition("#")
        if doc != "differences.md" or anchor not in anchors:
            out.append(entry.anchor)
    return out


# --- recorders ---------------------------------------------------------------------------


def recorder_args(argv: list[str] | None, description: str = "") -> argparse.Namespace:
    """Every recorder's command line: --rabbitmq AMQP_URL --management HTTP_URL."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rabbitmq", required=True, help="amqp://guest:guest@127.0.0.1:5677/%%2F")
    parser.add_argument("--management", required=True, help="http://127.0.0.1:15677")
    parser.add_argument("--only", default=None, help="record only cases matching this glob")
    return parser.parse_args(argv)


def write_json(path: Path, value: Any) -> None:
    """Stable, diff-friendly JSON (sorted keys, one field a line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())
