"""Option parsing and offset planning, without Spark or a broker: every error names its option."""

from __future__ import annotations

import pytest

from leveret.spark._tail import PartitionTail
from leveret.spark.options import OptionError, parse_read, parse_write
from leveret.spark.planning import DataLoss, OffsetRange, check_start, limit, resolve, split

URI = "amqp://guest:guest@127.0.0.1:5672/%2F"


def read(streaming: bool = False, **opts: str):
    return parse_read({"uri": URI, "stream": "s", **opts}, streaming=streaming)


@pytest.mark.parametrize(
    ("opts", "streaming", "named"),
    [
        ({"strem": "x"}, False, "strem"),
        ({"path": "x"}, False, "path"),
        ({"startingOffsets": "first"}, False, "startingOffsets"),
        ({"startingOffsets": "{bad json"}, False, "startingOffsets"),
        ({"startingOffsets": '{"s": -3}'}, False, "startingOffsets"),
        ({"startingOffsets": '{"s": "7"}'}, False, "startingOffsets"),
        ({"startingOffsets": "[]"}, False, "startingOffsets"),
        ({"endingOffsets": "earliest"}, False, "endingOffsets"),
        ({"endingOffsets": '{"s": -2}'}, False, "endingOffsets"),
        ({"endingOffsets": "latest"}, True, "endingOffsets"),
        ({"startingTimestamp": "yesterday"}, False, "startingTimestamp"),
        ({"startingTimestamp": "-5"}, False, "startingTimestamp"),
        ({"startingTimestamp": "5", "startingOffsets": "earliest"}, False, "startingTimestamp"),
        ({"endingTimestamp": "5"}, True, "endingTimestamp"),
        ({"maxMessagesPerTrigger": "0"}, True, "maxMessagesPerTrigger"),
        ({"maxMessagesPerTrigger": "lots"}, True, "maxMessagesPerTrigger"),
        ({"maxMessagesPerTrigger": "10"}, False, "maxMessagesPerTrigger"),
        ({"failOnDataLoss": "maybe"}, False, "failOnDataLoss"),
        ({"includeHeaders": "2"}, False, "includeHeaders"),
        ({"minPartitions": "-1"}, False, "minPartitions"),
        ({"maxRecordsPerPartition": "1.5"}, False, "maxRecordsPerPartition"),
        ({"prefetch": "0"}, False, "prefetch"),
        ({"prefetch": "65536"}, False, "prefetch"),
        ({"timeout": "0"}, False, "timeout"),
        ({"uri": "http://x"}, False, "uri"),
        ({"uri": "amqp://h:port/"}, False, "uri"),
        ({"uri": ""}, False, "uri"),
        ({"superStream": "t"}, False, "superStream"),
    ],
)
def test_bad_read_option_is_named(opts, streaming, named):
    with pytest.raises(OptionError, match=named):
        read(streaming, **opts)


def test_stream_or_super_stream_is_required():
    with pytest.raises(OptionError, match="'stream' or option 'superStream'"):
        parse_read({"uri": URI}, streaming=False)


def test_options_are_case_insensitive_and_reported_in_their_documented_spelling():
    opts = parse_read(
        {"uri": URI, "superstream": "clicks", "startingoffsets": '{"clicks-1": 5}'}, True
    )
    assert opts.super_stream == "clicks" and opts.starting == {"clicks-1": 5}
    with pytest.raises(OptionError, match="'maxMessagesPerTrigger'"):
        parse_read({"uri": URI, "stream": "s", "maxmessagespertrigger": "x"}, True)


def test_read_defaults():
    opts = read()
    assert opts.starting is None and opts.ending == "latest"
    assert opts.fail_on_data_loss and not opts.include_headers


@pytest.mark.parametrize(
    ("opts", "named"),
    [
        ({}, "exchange"),
        ({"exchange": "x", "stream": "s"}, "exchange"),
        ({"stream": "s", "routingKey": "k"}, "routingKey"),
        ({"stream": ""}, "stream"),
        ({"exchange": "x", "mandatory": "sometimes"}, "mandatory"),
        ({"exchange": "x", "routingKey": "k" * 256}, "routingKey"),
        ({"exchange": "x", "startingOffsets": "earliest"}, "startingOffsets"),
    ],
)
def test_bad_write_option_is_named(opts, named):
    with pytest.raises(OptionError, match=named):
        parse_write({"uri": URI, **opts}, streaming=False)


def test_write_to_a_stream_goes_through_the_default_exchange():
    opts = parse_write({"uri": URI, "stream": "events"}, streaming=True)
    assert (opts.exchange, opts.routing_key) == ("", "events")


def tails(*spec: tuple[str, int, int]) -> list[PartitionTail]:
    return [PartitionTail(s, first, nxt, None, None, None) for s, first, nxt in spec]


def test_resolve_json_offsets_with_earliest_and_latest_markers():
    t = tails(("c-0", 5, 10), ("c-1", 0, 7), ("c-2", 2, 2))
    assert resolve("startingOffsets", {"c-0": -2, "c-1": 3}, t) == {"c-0": 5, "c-1": 3, "c-2": 2}
    assert resolve("endingOffsets", {"c-0": -1}, t, default=-1) == {"c-0": 10, "c-1": 7, "c-2": 2}
    with pytest.raises(OptionError, match="startingOffsets.*c-9"):
        resolve("startingOffsets", {"c-9": 1}, t)


def test_data_loss_is_named_or_skipped():
    t = tails(("c-0", 5, 10))
    with pytest.raises(DataLoss, match="offsets 2..4 of stream 'c-0'.*failOnDataLoss"):
        check_start({"c-0": 2}, t, fail_on_data_loss=True)
    assert check_start({"c-0": 2}, t, fail_on_data_loss=False) == {"c-0": 5}


def test_split_by_min_partitions_and_max_records_covers_each_range_exactly():
    parts = [OffsetRange("a", 0, 1000), OffsetRange("b", 10, 110)]
    cut = split(parts, min_partitions=11)
    assert len(cut) >= 11
    for p in parts:
        mine = [r for r in cut if r.stream == p.stream]
        assert mine[0].start == p.start and mine[-1].end == p.end
        assert all(x.end == y.start for x, y in zip(mine, mine[1:], strict=False))
    assert max(r.size for r in split(parts, max_records=64)) <= 64
    assert split([OffsetRange("a", 0, 3)], min_partitions=10) == [
        OffsetRange("a", 0, 1),
        OffsetRange("a", 1, 2),
        OffsetRange("a", 2, 3),
    ]


def test_limit_shares_the_budget_and_never_exceeds_it():
    start = {"a": 0, "b": 100, "c": 5}
    available = {"a": 1000, "b": 110, "c": 5}
    end = limit(start, available, 101)
    assert sum(end[s] - start[s] for s in start) == 101
    assert end["b"] > 100 and end["c"] == 5
    assert all(end[s] <= available[s] for s in start)
    assert limit(start, available, 10_000) == available
