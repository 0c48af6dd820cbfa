"""Deliberate differences of Leveret's AMQP answers from RabbitMQ 3.10.8.

Each entry names the scenario (fnmatch on its id), the kind and path of the
difference (as runner.compare reports them: `steps.6.reply.reply_code`), its entry in
docs/differences.md and a reason a user would accept. An entry that allows nothing
in any scenario it names fails the replay test: remove it.
"""

from __future__ import annotations

from ..common import Allowed

_BAD_OFFSET = "differences.md#amqp-stream-bad-offset"
_BAD_OFFSET_WHY = "406 on the channel, not 541 INTERNAL_ERROR closing the connection"
_COUNT = "differences.md#amqp-stream-consumer-count"
_COUNT_WHY = "declare-ok reports the stream's consumers; RabbitMQ 3.10 says 0"

ALLOWED: list[Allowed] = [
    # "bogus", true and 1.5 (the 541s), each with the liveness check after it
    *(
        Allowed("streams.bad_offsets", "*", f"steps.{n}.*", _BAD_OFFSET, _BAD_OFFSET_WHY)
        for n in (6, 7, 11, 12, 26, 27)
    ),
    # "1h", "2" and "bogus" in a byte array (the 541s), each with the liveness check
    *(
        Allowed(
            "streams.binary_offsets",
            "*",
            f"steps.{n}.*",
            "differences.md#amqp-stream-binary-offset",
            "406 naming the value on the channel, not 541 INTERNAL_ERROR closing the connection",
        )
        for n in (24, 25, 29, 30, 34, 35)
    ),
    Allowed("streams.consume_rules", "value", "steps.*.reply.consumer_count", _COUNT, _COUNT_WHY),
    Allowed(
        "streams.acks_give_credit", "value", "steps.*.reply.consumer_count", _COUNT, _COUNT_WHY
    ),
    Allowed(
        "rabbit_stream_queue.consume_and_ack",
        "value",
        "steps.*.reply.consumer_count",
        _COUNT,
        _COUNT_WHY,
    ),
    Allowed(
        "streams.delete_if_unused",
        "*",
        "steps.[67].*",
        "differences.md#amqp-stream-if-unused",
        "if-unused refuses to delete a stream in use (RabbitMQ deletes it and cancels "
        "its consumers)",
    ),
    Allowed(
        "streams.exclusive_consumer",
        "*",
        "steps.[0-9]*.reply*",
        "differences.md#amqp-stream-exclusive-consumer",
        "an exclusive consumer keeps others out (RabbitMQ ignores the flag on streams)",
    ),
    Allowed(
        "*",
        "extra",
        "steps.*.reply.properties.headers.x-last-death-*",
        "differences.md#amqp-x-last-death",
        "dead-lettered messages also carry x-last-death-* (as RabbitMQ 3.13 writes them)",
    ),
    Allowed(
        "protocol.refused_flags",
        "*",
        "steps.[789].*",
        "differences.md#amqp-channel-flow",
        "channel.flow active=false pauses deliveries as the spec says (RabbitMQ: 540)",
    ),
    Allowed(
        "protocol.handshake_offers",
        "*",
        "steps.1.value.server_properties keys.*",
        "differences.md#amqp-server-product",
        "server_properties name Leveret (product, information) and claim no RabbitMQ copyright",
    ),
    Allowed(
        "frames.*",
        "value",
        "steps.*.got.0.reply_text",
        "differences.md#amqp-frame-error-texts",
        "the same codes; the text names the frame, channel and rule instead of dumping octets",
    ),
    Allowed(
        "core.channel_numbers",
        "*",
        "steps.5.*",
        "differences.md#amqp-channel-max",
        "a channel number above channel_max is refused, as the spec defines channel-max",
    ),
    Allowed(
        "login.refused_with_capability*",
        "value",
        "steps.*.got.[01].slow",
        "differences.md#amqp-login-refused-capable",
        "the 403 for a client with authentication_failure_close comes after the login "
        "delay, not at once (the delay then slows guessing with such clients too)",
    ),
    Allowed(
        "login.refused_with_frames_behind_the_start_ok",
        "*",
        "steps.[01].got.*",
        "differences.md#amqp-login-refused-frames",
        "a connection.close sent behind a refused start-ok is not answered with close-ok "
        "at once (that would tell a guesser the login failed before the delay is over)",
    ),
    Allowed(
        "quorum.counts_and_purge",
        "value",
        "steps.6.reply.consumer_count",
        "differences.md#quorum-consumer-count-gets",
        "a basic.get awaiting its ack is not counted as a consumer (RabbitMQ 3.10's quorum "
        "queues count it)",
    ),
    # the basic.gets after the first two unbinds: RabbitMQ still routes to the binding
    # left; Leveret's one binding went with the first unbind
]
