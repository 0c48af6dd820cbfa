"""`format("leveret")`: the DataSource that Spark instantiates from the options.

Why checks happen here: Spark calls `reader`, `streamReader`, `writer` and `streamWriter`
on the driver, so a bad option, an unreachable broker, a refused login or a missing
stream or exchange fails there, with a message naming it, before any task runs.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from leveret.spark.options import check_names, parse_read, parse_write
from leveret.spark.rows import schema_ddl


class LeveretDataSource(DataSource):
    """Read Leveret streams and super streams by offset; write rows to an exchange.

    Register it once per session: ``spark.dataSource.register(LeveretDataSource)``.
    """

    @classmethod
    def name(cls) -> str:
        return "leveret"

    def schema(self) -> str:
        """Called by load(): misspelt option names fail here, the rest when the query runs."""
        check_names(self.options)
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return schema_ddl(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        from leveret.spark.reader import BatchReader

        return BatchReader(parse_read(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from leveret.spark.reader import StreamReader

        return StreamReader(parse_read(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from leveret.spark.writer import BatchWriter, check_schema, check_target

        opts = parse_write(self.options, streaming=False)
        check_schema(schema, opts)
        check_target(opts)
        return BatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from leveret.spark.writer import StreamWriter, check_schema, check_target

        opts = parse_write(self.options, streaming=True)
        check_schema(schema, opts)
        check_target(opts)
        return StreamWriter(opts)
