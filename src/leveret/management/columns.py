"""The `columns` query parameter: which fields of an answer to keep.

RabbitMQ applies it to every GET answer, a single object as well as a list, unless
`page` is given (then only a page's `items`), and writes an object that keeps no
field as `[]` (an empty Erlang property list). The middleware (app.py) applies it to
every answer; listing() applies it before paging, as RabbitMQ does.
"""

from __future__ import annotations

from typing import Any

#: a column list as RabbitMQ parses `columns=a,b.c`: each column split on its dots
Columns = list[list[str]]


def parse_columns(query: Any) -> Columns | None:
    """The `columns` query parameter as RabbitMQ reads it (None: absent, every field).

    Empty names are dropped (Erlang's string:tokens), so `columns=` keeps no field."""
    raw = query.get("columns")
    if raw is None:
        return None
    out = [[part for part in column.split(".") if part] for column in raw.split(",")]
    return [column for column in out if column]


def select_columns(value: Any, columns: Columns | None) -> Any:
    """Only these columns of `value`, as RabbitMQ's extract_column_items: an object keeps
    the keys a column names (`a.b` keeps `b` inside `a`), a list has each item trimmed,
    anything else is kept. An object left with no key is `[]`, as RabbitMQ writes an
    empty Erlang property list."""
    if columns is None:
        return value
    if isinstance(value, list):
        return [select_columns(item, columns) for item in value]
    if not isinstance(value, dict) or not value:
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        matching = [column for column in columns if column[0] == key]
        if not matching:
            continue
        whole = any(len(column) == 1 for column in matching)
        out[key] = item if whole else select_columns(item, [c[1:] for c in matching])
    return out if out else []
