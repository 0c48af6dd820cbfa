"""Command-line flags of `leveret perf` and their validation."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/%2F"


@dataclass(frozen=True)
class BrokerAddress:
    host: str
    port: int
    user: str
    password: str
    vhost: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port} (vhost {self.vhost!r})"


def parse_uri(uri: str) -> BrokerAddress:
    """Parse an amqp:// URI the way RabbitMQ clients do (missing parts get defaults)."""
    parts = urlsplit(uri)
    if parts.scheme != "amqp":
        raise ValueError(f"unsupported URI scheme {parts.scheme!r}: expected amqp://")
    try:
        port = parts.port or 5672
    except ValueError as exc:
        raise ValueError(f"bad port in URI {uri!r}: {exc}") from None
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    return BrokerAddress(
        host=parts.hostname or "127.0.0.1",
        port=port,
        user=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=unquote(path) if path else "/",
    )


def _int_at_least(minimum: int) -> type:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    convert.__name__ = f"integer >= {minimum}"
    return convert  # type: ignore[return-value]


def _float_at_least(minimum: float, strict: bool = False) -> type:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum or (strict and value == minimum) or value != value:
            raise argparse.ArgumentTypeError(
                f"must be {'>' if strict else '>='} {minimum:g}, got {text}"
            )
        return value

    convert.__name__ = "number"
    return convert  # type: ignore[return-value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every `leveret perf` flag to `parser` (a subcommand parser or a standalone one)."""
    nonneg = _int_at_least(0)
    positive = _int_at_least(1)
    parser.add_argument("--uri", default=DEFAULT_URI, help="broker URI (default %(default)s)")
    parser.add_argument("--producers", type=nonneg, default=1, metavar="N", help="default 1")
    parser.add_argument(
        "--consumers",
        type=nonneg,
        default=1,
        metavar="N",
        help="total consumers, spread over the queues so each queue gets one (default 1)",
    )
    parser.add_argument(
        "--queues",
        type=positive,
        default=None,
        metavar="N",
        help="number of queues named <queue-name><i>; producer i publishes to queue i mod N "
        "(default 1)",
    )
    parser.add_argument(
        "--queue-name", default="perf.q", metavar="PREFIX", help="queue name prefix (perf.q)"
    )
    parser.add_argument(
        "--size",
        type=nonneg,
        default=16,
        metavar="BYTES",
        help="message body size; latency needs >= 8 bytes (default 16)",
    )
    parser.add_argument(
        "--persistent",
        action="store_true",
        help="durable queues/exchange and delivery_mode 2 messages",
    )
    parser.add_argument(
        "--queue-type",
        choices=("classic", "quorum"),
        default="classic",
        help="x-queue-type of the queues it declares (quorum needs --persistent; default "
        "%(default)s)",
    )
    parser.add_argument(
        "--confirm",
        type=nonneg,
        default=0,
        metavar="WINDOW",
        help="publisher confirms with at most WINDOW unconfirmed messages (0 = off)",
    )
    parser.add_argument(
        "--prefetch", type=nonneg, default=500, metavar="N", help="basic.qos prefetch (500)"
    )
    parser.add_argument("--autoack", action="store_true", help="consume with no_ack")
    parser.add_argument(
        "--multi-ack-every",
        type=positive,
        default=None,
        metavar="N",
        help="ack with multiple=true every N messages (default prefetch/4, or 100 without "
        "prefetch); pending acks are also flushed every second",
    )
    parser.add_argument(
        "--fanout",
        type=nonneg,
        default=0,
        metavar="N",
        help="publish to a fanout exchange bound to N queues (replaces --queues)",
    )
    parser.add_argument(
        "--rate",
        type=_float_at_least(0.0),
        default=0.0,
        metavar="MSG/S",
        help="per-producer publish rate limit (0 = unlimited)",
    )
    parser.add_argument(
        "--duration",
        type=_float_at_least(0.0, strict=True),
        default=10.0,
        metavar="SECONDS",
        help="measured window, after the warm-up (default 10)",
    )
    parser.add_argument(
        "--warmup",
        type=_float_at_least(0.0),
        default=0.0,
        metavar="SECONDS",
        help="traffic before the measured window, excluded from the summary (default 0)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON summary object on stdout (live lines go to stderr)",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-second lines")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="do not delete the queues/exchange at the end",
    )
    parser.set_defaults(_perf_parser=parser)


def validate(args: argparse.Namespace) -> tuple[BrokerAddress, list[str]]:
    """Cross-flag checks argparse cannot express; returns the address and queue names.

    Errors go through the parser that add_arguments() was given, so `leveret perf`
    and `python -m leveret.perf` both exit with argparse's usual status 2.
    """
    parser: argparse.ArgumentParser | None = getattr(args, "_perf_parser", None)

    def fail(message: str) -> None:
        if parser is not None:
            parser.error(message)
        raise SystemExit(f"leveret perf: error: {message}")

    if args.producers == 0 and args.consumers == 0:
        fail("nothing to do: --producers and --consumers are both 0")
    if args.fanout and args.queues is not None:
        fail("--fanout N declares its own N queues; do not combine it with --queues")
    if args.prefetch > 65535:
        fail("--prefetch must be <= 65535 (basic.qos prefetch-count is a short)")
    if args.multi_ack_every and args.prefetch and args.multi_ack_every >= args.prefetch:
        fail("--multi-ack-every must be below --prefetch, or consumers would stall")
    if not args.queue_name:
        fail("--queue-name must not be empty")
    if args.queue_type == "quorum" and not args.persistent:
        fail("--queue-type quorum needs --persistent (quorum queues are durable)")
    try:
        address = parse_uri(args.uri)
    except ValueError as exc:
        fail(f"--uri: {exc}")
        raise  # unreachable: fail() exits
    count = args.fanout or args.queues or 1
    return address, [f"{args.queue_name}{i}" for i in range(count)]
