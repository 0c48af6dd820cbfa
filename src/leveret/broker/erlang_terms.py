"""JSON values written as RabbitMQ writes them in its validation errors.

RabbitMQ formats the offending value with Erlang's `~p`: a JSON string is a
binary `<<"ten">>`, an object a map `#{<<"a">> => 1}`, null the atom `null`.
Tools and people compare these texts with RabbitMQ's, so short values are
written the same way (Erlang wraps long ones over several lines; these stay
on one: docs/differences.md#plugins-long-erlang-terms).
"""

from __future__ import annotations

from typing import Any


def term(value: Any) -> str:
    """`value` as Erlang's ~p prints the term jsx decodes it to."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return binary(value)
    if isinstance(value, list):
        return "[" + ",".join(term(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode())
        return "#{" + ",".join(f"{binary(k)} => {term(v)}" for k, v in items) + "}"
    return repr(value)


def binary(text: str) -> str:
    body = text.replace("\\", "\\\\").replace('"', '\\"')
    if text.isascii():
        return f'<<"{body}">>'
    return f'<<"{body}"/utf8>>'


def proplist(items: dict[str, Any]) -> str:
    """[{<<"key">>,value},...] in key order, as RabbitMQ lists unrecognised terms."""
    pairs = sorted(items.items(), key=lambda kv: kv[0].encode())
    return "[" + ",".join("{" + binary(k) + "," + term(v) + "}" for k, v in pairs) + "]"


def string(text: str) -> str:
    """An Erlang string (a list of characters) as ~p prints it: "text"."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _float(value: float) -> str:
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}e{int(exponent)}"
    return text
