"""The broker's configuration file (TOML): every server setting, listeners and TLS.

Keys are ServerConfig's field names (`data_dir` or `data-dir`), so a setting
added to ServerConfig is configurable here without a change to this module.
Listeners are `[[listeners]]` tables, TLS may go in a `[tls]` table. Paths are
relative to the file. A bad file is refused with the file, the key and the
reason; flags given on the command line override the file (cli.py).

    port = 5672
    data_dir = "/var/lib/leveret"
    workers = "auto"              # or a number; docs/workers.md
    loopback_users = []
    load_definitions = "definitions.json"

    [[listeners]]
    host = "0.0.0.0"
    port = 5671
    kind = "amqps"

    [tls]
    cert = "server.pem"
    key = "server.key"

    [shovels.drain-orders]        # a static shovel, keys as a dynamic shovel's value
    src-uri = "amqp://guest:guest@old-broker"
    src-queue = "orders"
    dest-uri = "amqp://"
    dest-queue = "orders"
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing
from typing import Any

from leveret.config import Listener, ServerConfig

LOG_LEVELS = ("debug", "info", "warning", "error")
CHOICES = {
    "fsync": ("always", "batch", "never"),
    "log_level": LOG_LEVELS,
    "tls_cert_login_from": ("common_name", "distinguished_name"),
    "cert_login_from": ("common_name", "distinguished_name"),  # in the [tls] table
}
PATH_KEYS = ("data_dir", "load_definitions", "tls_cert", "tls_key", "tls_ca")
TLS_KEYS = ("cert", "key", "ca", "verify", "fail_if_no_peer_cert", "port", "cert_login_from")
LISTENER_KEYS = ("host", "port", "kind")


class ConfigFileError(ValueError):
    """The message names the file, the key and what is wrong."""


def _field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(ServerConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(ServerConfig)}


def known_keys() -> list[str]:
    return sorted({*_field_types(), "log_level", "tls"})


def load(path: str) -> dict[str, Any]:
    """The settings in the file as {ServerConfig field or 'log_level': value}."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
    base = os.path.dirname(os.path.abspath(path))
    types_ = _field_types()
    values: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key = raw_key.replace("-", "_")
        if key == "tls":
            values.update(_tls(path, value))
            continue
        if key == "listeners":
            values["listeners"] = _listeners(path, value)
            continue
        if key == "shovels":
            values["shovels"] = _shovels(path, value)
            continue
        if key == "log_level":
            values[key] = _check(path, key, value, str)
            continue
        if key == "workers":
            values[key] = _workers(path, raw_key, value)
            continue
        if key not in types_:
            close = difflib.get_close_matches(key, known_keys(), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigFileError(f"{path}: unknown key '{raw_key}'{hint}")
        values[key] = _check(path, key, value, types_[key])
    for key in PATH_KEYS:
        if isinstance(values.get(key), str):
            values[key] = os.path.join(base, os.path.expanduser(values[key]))
    return values


def _workers(path: str, raw_key: str, value: Any) -> int | str:
    """`workers`: a whole number from 1 or "auto", as --workers takes it (the CLI
    resolves "auto"; ServerConfig.workers holds the count it resolved to)."""
    from leveret.workers.count import parse

    try:
        return parse(value)
    except ValueError as exc:
        raise ConfigFileError(f"{path}: key '{raw_key}': {exc}") from None


def _tls(path: str, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigFileError(f"{path}: key 'tls' must be a table ([tls])")
    types_ = _field_types()
    out = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in TLS_KEYS:
            raise ConfigFileError(f"{path}: unknown key 'tls.{key}'; known: " + ", ".join(TLS_KEYS))
        field = f"tls_{name}"
        out[field] = _check(path, f"tls.{key}", value, types_[field])
    return out


def _listeners(path: str, items: Any) -> list[Listener]:
    if not isinstance(items, list):
        raise ConfigFileError(f"{path}: key 'listeners' must be an array of tables ([[listeners]])")
    listeners = []
    for i, item in enumerate(items):
        where = f"listeners[{i}]"
        if not isinstance(item, dict):
            raise ConfigFileError(f"{path}: {where} must be a table")
        for key in item:
            if key not in LISTENER_KEYS:
                raise ConfigFileError(
                    f"{path}: unknown key '{where}.{key}'; known: " + ", ".join(LISTENER_KEYS)
                )
        if "port" not in item:
            raise ConfigFileError(f"{path}: {where} needs a port")
        host = _check(path, f"{where}.host", item.get("host", "127.0.0.1"), str)
        port = _check(path, f"{where}.port", item["port"], int, port=True)
        kind = item.get("kind", "amqp")
        if kind not in ("amqp", "amqps"):
            raise ConfigFileError(f"{path}: {where}.kind must be 'amqp' or 'amqps', got {kind!r}")
        listeners.append(Listener(host, port, kind))
    return listeners


def _shovels(path: str, table: Any) -> dict[str, dict[str, Any]]:
    """Static shovels: [shovels.NAME] tables with a dynamic shovel's keys, checked as one."""
    from leveret.links import validation

    if not isinstance(table, dict):
        raise ConfigFileError(f"{path}: key 'shovels' must be a table of tables ([shovels.NAME])")
    out = {}
    for name, value in table.items():
        problems = validation.shovel(None, "/", name, value)
        if problems:
            raise ConfigFileError(f"{path}: shovel '{name}': " + "; ".join(problems))
        out[name] = dict(value)
    return out


def _check(path: str, key: str, value: Any, expected: Any, port: bool = False) -> Any:
    """`value` if it fits the field's type, else ConfigFileError naming file and key."""
    name = key.rsplit(".", 1)[-1]

    def fail(reason: str) -> ConfigFileError:
        return ConfigFileError(f"{path}: key '{key}': {reason}, got {value!r}")

    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(expected) if a is not type(None)]
        if value is None:
            return None
        expected = options[0]
        origin = typing.get_origin(expected)
    if origin is list:
        (item,) = typing.get_args(expected)
        if item is str:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise fail("expected a list of strings")
            return list(value)
        raise fail("lists of this kind cannot be set in the file")
    if expected is bool:
        if not isinstance(value, bool):
            raise fail("expected true or false")
        return value
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("expected a whole number")
        if value < 0:
            raise fail("must not be negative")
        if (port or name.endswith("port")) and value > 65535:
            raise fail("a port is 0-65535")
        return value
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail("expected a number")
        if value != value or value in (float("inf"), float("-inf")):
            raise fail("expected a finite number")
        if value < 0:
            raise fail("must not be negative")
        return float(value)
    if expected is str:
        if not isinstance(value, str):
            raise fail("expected a string")
        choices = CHOICES.get(name)
        if choices and value not in choices:
            raise fail("expected one of " + ", ".join(choices))
        return value
    raise fail("this setting cannot be given in the file")
