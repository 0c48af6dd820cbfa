"""Options of `format("leveret")`, checked once on the driver.

Why a module of its own, without pyspark: every bad option must fail with a message that
names the option, before any task runs, and that is easiest to test without Spark.
Spark hands options over case-insensitively (lower-cased keys), so errors use the
documented spelling from `_CANONICAL`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from leveret.spark._client import check_uri

EARLIEST = -2  # Kafka's convention in JSON offsets
LATEST = -1

READ_OPTIONS = (
    "uri",
    "stream",
    "superStream",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "maxMessagesPerTrigger",
    "failOnDataLoss",
    "includeHeaders",
    "minPartitions",
    "maxRecordsPerPartition",
    "prefetch",
    "timeout",
    "debugFailOnce",
)
WRITE_OPTIONS = (
    "uri",
    "exchange",
    "routingKey",
    "stream",
    "superStream",
    "mandatory",
    "timeout",
    "debugFailOnce",
)
# options Spark itself reads, and passes on to the source/sink as well
SPARK_OWN = frozenset({"checkpointlocation"})
_CANONICAL = {name.lower(): name for name in READ_OPTIONS + WRITE_OPTIONS}


class OptionError(ValueError):
    """A missing, unknown or malformed option; the message names it."""


Offsets = Literal["earliest", "latest"] | dict[str, int]


@dataclass(frozen=True)
class ReadOptions:
    uri: str
    stream: str | None
    super_stream: str | None
    starting: Offsets | None  # None: the default (earliest for batch, latest for streaming)
    ending: Offsets
    starting_timestamp: int | None
    ending_timestamp: int | None
    max_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    max_records_per_partition: int | None
    prefetch: int
    timeout: float
    debug_fail_once: str | None = None
    raw: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def source_name(self) -> str:
        return self.super_stream or self.stream or ""


@dataclass(frozen=True)
class WriteOptions:
    uri: str
    exchange: str
    routing_key: str | None
    mandatory: bool
    timeout: float
    debug_fail_once: str | None = None


def _normalise(options: Mapping[str, str], allowed: tuple[str, ...], what: str) -> dict[str, str]:
    allowed_lower = {a.lower() for a in allowed}
    out: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low in SPARK_OWN:
            continue
        if low not in allowed_lower:
            if low == "path":
                raise OptionError(
                    f"format('leveret') takes no path (got {value!r}); "
                    "name the stream with .option('stream', ...) or .option('superStream', ...)"
                )
            known = ", ".join(allowed)
            raise OptionError(f"unknown option {key!r} for {what}; the options are: {known}")
        out[_CANONICAL[low]] = "" if value is None else str(value)
    return out


def check_names(options: Mapping[str, str]) -> None:
    """Refuse option names that neither reading nor writing knows."""
    _normalise(options, READ_OPTIONS + WRITE_OPTIONS, "format('leveret')")


def _uri(opts: dict[str, str]) -> str:
    uri = opts.get("uri")
    if not uri:
        raise OptionError(
            "option 'uri' is required, e.g. amqp://guest:guest@127.0.0.1:5672/%2F "
            "(a cluster's nodes: amqp://guest:guest@host1:5672,host2:5672,host3:5672/%2F)"
        )
    try:
        check_uri(uri)
    except ValueError as exc:
        raise OptionError(f"option 'uri' is malformed: {exc}") from None
    return uri


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    if name not in opts:
        return default
    value = opts[name].strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name!r} must be true or false, got {opts[name]!r}")


def _positive_int(opts: dict[str, str], name: str) -> int | None:
    if name not in opts:
        return None
    try:
        value = int(opts[name])
    except ValueError:
        raise OptionError(
            f"option {name!r} must be a positive integer, got {opts[name]!r}"
        ) from None
    if value <= 0:
        raise OptionError(f"option {name!r} must be a positive integer, got {opts[name]!r}")
    return value


def _prefetch(opts: dict[str, str]) -> int:
    value = _positive_int(opts, "prefetch") or 2000
    if value > 65535:  # basic.qos's prefetch-count is a short
        raise OptionError(f"option 'prefetch' must be at most 65535, got {opts['prefetch']!r}")
    return value


def _timestamp(opts: dict[str, str], name: str) -> int | None:
    if name not in opts:
        return None
    try:
        value = int(opts[name])
    except ValueError:
        raise OptionError(
            f"option {name!r} must be milliseconds since the epoch, got {opts[name]!r}"
        ) from None
    if value < 0:
        raise OptionError(f"option {name!r} must not be negative, got {opts[name]!r}")
    return value


def _positive_float(opts: dict[str, str], name: str, default: float) -> float:
    if name not in opts:
        return default
    try:
        value = float(opts[name])
    except ValueError:
        raise OptionError(
            f"option {name!r} must be a number of seconds, got {opts[name]!r}"
        ) from None
    if not value > 0:
        raise OptionError(f"option {name!r} must be above 0, got {opts[name]!r}")
    return value


def parse_offsets(name: str, text: str, allow: tuple[str, ...]) -> Offsets:
    """`earliest`, `latest` or JSON {"stream": offset} with -2 = earliest, -1 = latest."""
    value = text.strip()
    if value.lower() in allow:
        return value.lower()  # type: ignore[return-value]
    if not value.startswith("{"):
        words = " or ".join(allow)
        raise OptionError(
            f"option {name!r} must be {words} or JSON such as "
            f'{{"clicks-0": 42, "clicks-1": -2}}, got {text!r}'
        )
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {name!r} is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option {name!r} must be a non-empty JSON object of stream: offset")
    out: dict[str, int] = {}
    for stream, offset in parsed.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
            raise OptionError(
                f"option {name!r}: the offset of {stream!r} must be an integer >= 0, "
                f"or -2 (earliest) or -1 (latest), got {offset!r}"
            )
        out[stream] = offset
    if name == "endingOffsets" and EARLIEST in out.values():
        bad = [s for s, o in out.items() if o == EARLIEST]
        raise OptionError(f"option 'endingOffsets' cannot be -2 (earliest), for {bad}")
    return out


def parse_read(options: Mapping[str, str], streaming: bool) -> ReadOptions:
    what = "readStream.format('leveret')" if streaming else "read.format('leveret')"
    opts = _normalise(options, READ_OPTIONS, what)
    uri = _uri(opts)
    stream, super_stream = opts.get("stream"), opts.get("superStream")
    if stream is not None and super_stream is not None:
        raise OptionError("give either option 'stream' or option 'superStream', not both")
    if not stream and not super_stream:
        if stream == "" or super_stream == "":
            raise OptionError("option 'stream' / 'superStream' must not be empty")
        raise OptionError("option 'stream' or option 'superStream' is required")
    starting: Offsets | None = None
    if "startingOffsets" in opts:
        starting = parse_offsets("startingOffsets", opts["startingOffsets"], ("earliest", "latest"))
    ending: Offsets = "latest"
    if "endingOffsets" in opts:
        if streaming:
            raise OptionError(
                "option 'endingOffsets' is for batch reads only; a streaming query has no end"
            )
        ending = parse_offsets("endingOffsets", opts["endingOffsets"], ("latest",))
    starting_ts = _timestamp(opts, "startingTimestamp")
    if starting_ts is not None and starting is not None:
        raise OptionError("give either option 'startingOffsets' or 'startingTimestamp', not both")
    ending_ts = _timestamp(opts, "endingTimestamp")
    if ending_ts is not None:
        if streaming:
            raise OptionError("option 'endingTimestamp' is for batch reads only")
        if "endingOffsets" in opts:
            raise OptionError("give either option 'endingOffsets' or 'endingTimestamp', not both")
    max_per_trigger = _positive_int(opts, "maxMessagesPerTrigger")
    if max_per_trigger is not None and not streaming:
        raise OptionError("option 'maxMessagesPerTrigger' is for streaming queries only")
    return ReadOptions(
        uri=uri,
        stream=stream or None,
        super_stream=super_stream or None,
        starting=starting,
        ending=ending,
        starting_timestamp=starting_ts,
        ending_timestamp=ending_ts,
        max_per_trigger=max_per_trigger,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        min_partitions=_positive_int(opts, "minPartitions"),
        max_records_per_partition=_positive_int(opts, "maxRecordsPerPartition"),
        prefetch=_prefetch(opts),
        timeout=_positive_float(opts, "timeout", 30.0),
        debug_fail_once=opts.get("debugFailOnce") or None,
        raw=opts,
    )


def parse_write(options: Mapping[str, str], streaming: bool) -> WriteOptions:
    what = "writeStream.format('leveret')" if streaming else "write.format('leveret')"
    opts = _normalise(options, WRITE_OPTIONS, what)
    uri = _uri(opts)
    targets = [n for n in ("exchange", "stream", "superStream") if n in opts]
    if len(targets) > 1:
        raise OptionError(f"give only one of the options {', '.join(repr(t) for t in targets)}")
    if not targets:
        raise OptionError(
            "option 'exchange' is required for writing (or 'stream' / 'superStream'); "
            "use exchange '' with option 'routingKey' for the default exchange"
        )
    routing_key = opts.get("routingKey")
    if "stream" in opts:
        if not opts["stream"]:
            raise OptionError("option 'stream' must not be empty")
        if routing_key is not None:
            raise OptionError("option 'routingKey' does not go with 'stream' (its name is the key)")
        exchange, routing_key = "", opts["stream"]
    elif "superStream" in opts:
        if not opts["superStream"]:
            raise OptionError("option 'superStream' must not be empty")
        exchange = opts["superStream"]
    else:
        exchange = opts["exchange"]
    for name, value in (("exchange", exchange), ("routingKey", routing_key or "")):
        if len(value.encode()) > 255:
            raise OptionError(f"option {name!r} is longer than 255 bytes")
    return WriteOptions(
        uri=uri,
        exchange=exchange,
        routing_key=routing_key,
        mandatory=_bool(opts, "mandatory", False),
        timeout=_positive_float(opts, "timeout", 30.0),
        debug_fail_once=opts.get("debugFailOnce") or None,
    )


def fail_once(marker: str | None) -> bool:
    """Test hook (option debugFailOnce): true for the first caller only, across processes."""
    if not marker:
        return False
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True
