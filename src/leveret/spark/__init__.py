"""PySpark connector: ``spark.read.format("leveret")`` / ``writeStream.format("leveret")``.

Install with ``pip install "leveret[spark]"`` and register once per session::

    from leveret.spark import LeveretDataSource
    spark.dataSource.register(LeveretDataSource)

See docs/spark.md for the options, the row schema and exactly-once.
"""

from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("leveret.spark needs PySpark: pip install 'leveret[spark]'") from exc

from leveret.spark.source import LeveretDataSource

__all__ = ["LeveretDataSource"]
