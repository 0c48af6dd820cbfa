"""The example pipeline (python -m leveret.examples.clicks) runs and counts every click once."""

from __future__ import annotations

import pytest
from spark_support import stream_broker

from leveret.examples import clicks

pytestmark = [pytest.mark.spark, pytest.mark.leveret_only]


def test_click_counts_reach_the_exchange_and_parquet_exactly_once(spark, tmp_path, capsys):
    with stream_broker(tmp_path) as url:
        result = clicks.main(
            [
                "--uri",
                url,
                "--minutes",
                "3",
                "--per-minute",
                "200",
                "--seconds",
                "2",
                "--out",
                str(tmp_path / "out"),
                "--timeout",
                "240",
            ],
            spark=spark,
        )
    assert result["expected"] == result["printed"] == result["parquet"] == 600
    assert result["windows"] == 3 * len(clicks.PAGES)
    printed = capsys.readouterr().out
    assert "/pricing" in printed and "done: 600 of 600 clicks" in printed


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        clicks.parse_args(["--minutes", "0"])
