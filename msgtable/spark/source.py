"""The ``msgtable`` Spark data source (PySpark 4's Python Data Source API).

Batch read, ``spark.read.format("msgtable").option("dsn", URL).load(TABLE)``: the table's rows
with its real column types, split into ``partitions`` (default 4) id ranges (an integer id)
or id hash buckets (any other id), optionally only the rows in one ``state``
(msgtable.bulk.RowState):

* ``all`` (the default); ``acked``;
* ``unacked``: every row not acked, the dead ones too (due + scheduled + in_flight + dead);
* ``due``, ``scheduled``, ``in_flight``: waiting to be sent, never a dead row;
* ``dead``: the messages no poll sends again, as ``msgtable dead TABLE`` lists them. Of a
  table with ``vt_dead_letter``, the unacked rows of that dead-letter table, where its dead
  messages were moved: the frame has the dead-letter table's columns (``time_dead``,
  ``attempts``, ``last_error``: when each died, after how many sends, why); a dead-letter
  table several tables share holds the dead letters of each. Of a dead-letter table (one
  with time_dead, attempts and last_error), every unacked row. Of any other table, its rows
  dead in place (``time_acked IS NULL AND time_next = DEAD_TIME_NEXT``; ``epoch`` is how many
  times each was sent, ``last_error`` and ``time_dead`` say why and when where the table has
  them). Rows that died in place before their table had vt_dead_letter are not read then
  (``msgtable report`` counts them; ``state=unacked`` with that ``time_next`` finds them).

With ``subscription`` (a name), the read takes that subscription's view of the table
(msgtable.spark.subview): the rows handed to it, each with the subscription's delivery state
from its state table ``TABLE__NAME`` in the engine's columns (and its ``last_error`` and
``time_dead``), and ``state`` means the subscription's state. A subscription's dead messages
are dead in place. A name the table has no subscription of fails in one line.

Batch write, ``df.write.format("msgtable").option("dsn", URL).mode("append").save(TABLE)``:
bulk enqueue. Columns are matched by name (``id`` required); the engine's columns a frame
does not bring get a new message's values (due now, epoch 0, priority 0). Each partition is
one transaction of multi-row INSERTs (``batchRows`` rows each, default 1,000): it is enqueued
whole or not at all. A duplicate id fails its partition with a clear error, or with
``onDuplicate=skip`` is left as it is and counted. The driver logs what each job did.

Stream read, ``spark.readStream.format("msgtable").option("server", HOST:PORT).load(TABLE)``:
see msgtable.spark.stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from msgtable.bulk import BulkStatements, RowState
from msgtable.codec import format_time
from msgtable.errors import InvalidArgument, MsgtableError
from msgtable.mysql import DUPLICATE_KEY, error_code
from msgtable.spark.database import (
    connection,
    dead_letter_table,
    describe,
    id_bounds,
    subscription,
)
from msgtable.spark.options import (
    dsn_option,
    int_option,
    option,
    subscription_option,
    table_option,
)
from msgtable.spark.schema import spark_schema
from msgtable.spark.subview import SubscriptionStatements, SubscriptionView
from msgtable.tables import TableConfig

log = logging.getLogger("msgtable.spark")

DEFAULT_PARTITIONS = 4
DEFAULT_BATCH_ROWS = 1_000
FETCH_ROWS = 10_000  # rows an executor fetches per round trip


class MsgtableDataSource(DataSource):
    """``format("msgtable")``: message tables as Spark tables (see the module docstring)."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self._config: TableConfig | None = None
        self._read_config: TableConfig | None = None
        self._view: SubscriptionView | None = None

    @classmethod
    def name(cls) -> str:
        return "msgtable"

    def config(self) -> TableConfig:
        """The table ``load()`` / ``save()`` names."""
        if self._config is None:
            self._config = describe(dsn_option(self.options), table_option(self.options))
        return self._config

    def view(self) -> SubscriptionView | None:
        """The subscription's view a batch read takes (None: the table's own rows)."""
        name = subscription_option(self.options)
        if name and self._view is None:
            self._view = subscription(dsn_option(self.options), self.config(), name)
        return self._view

    def read_config(self) -> TableConfig:
        """The table a batch read takes its rows from: the named one, but for ``state=dead``
        of a table with vt_dead_letter its dead-letter table, where its dead messages are,
        and with ``subscription`` that subscription's view."""
        cfg = self.config()
        view = self.view()
        if view is not None:
            return view.config
        state = RowState.parse(option(self.options, "state", "all"))
        if state is not RowState.DEAD or not cfg.dead_letter:
            return cfg
        if self._read_config is None:
            self._read_config = dead_letter_table(dsn_option(self.options), cfg)
        return self._read_config

    def schema(self) -> str:
        if "server" in self.options and "dsn" not in self.options:
            from msgtable.spark.stream import stream_schema

            return stream_schema(self.options)
        RowState.parse(option(self.options, "state", "all"))  # bad read options fail at load()
        int_option(self.options, "partitions", DEFAULT_PARTITIONS)
        return spark_schema(self.read_config().columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MsgtableReader(self.options, self.read_config(), self.view())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidArgument("msgtable only appends (enqueues): use mode('append')")
        if subscription_option(self.options):
            raise InvalidArgument(
                "a write enqueues into the table, for every subscription: "
                "option subscription is for reads"
            )
        return MsgtableWriter(self.options, self.config(), schema.fieldNames())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from msgtable.spark.stream import MsgtableStreamReader

        return MsgtableStreamReader(self.options, schema)


# -- batch read ----------------------------------------------------------------------------
@dataclass
class Slice(InputPartition):
    """One read partition: ids lo..hi (inclusive), or hash bucket ``bucket`` of ``buckets``."""

    lo: Any = None
    hi: Any = None
    bucket: int = 0
    buckets: int = 0


class MsgtableReader(DataSourceReader):
    """A batch read: plans the partitions (id ranges or id hash buckets) on the driver, and
    reads one partition's rows in an executor, with one "now" for every partition."""

    def __init__(
        self, options: Mapping[str, str], cfg: TableConfig, view: SubscriptionView | None = None
    ) -> None:
        self.dsn = dsn_option(options)
        self.cfg = cfg
        self.view = view
        self.state = RowState.parse(option(options, "state", "all"))
        self.partitions_wanted = int_option(options, "partitions", DEFAULT_PARTITIONS)
        self.now_ns = time.time_ns()  # one "now" for every partition of the read

    def statements(self) -> BulkStatements:
        """The read's statements: of the table, or of the subscription's view of it."""
        if self.view is not None:
            return SubscriptionStatements(self.view)
        return BulkStatements(self.cfg)

    def partitions(self) -> Sequence[InputPartition]:
        n = self.partitions_wanted
        if not self.cfg.id_column.is_integer:
            return [Slice(bucket=k, buckets=n) for k in range(n)]
        bulk = self.statements()
        where, params = bulk.state(self.state, self.now_ns)
        lo, hi, count = id_bounds(self.dsn, bulk.id_bounds(where), params)
        if not count:
            return [Slice(lo=1, hi=0)]  # an empty range: no rows, the schema still holds
        lo, hi = int(lo), int(hi)
        n = max(1, min(n, hi - lo + 1))
        step = (hi - lo + 1) // n
        bounds = [lo + k * step for k in range(n)] + [hi + 1]
        return [Slice(lo=bounds[k], hi=bounds[k + 1] - 1) for k in range(n)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        import pymysql.cursors

        assert isinstance(partition, Slice)
        bulk = self.statements()
        where, params = bulk.state(self.state, self.now_ns)
        if partition.buckets:
            sql, args = bulk.select_hashed(where), [partition.buckets, partition.bucket, *params]
        else:
            sql, args = bulk.select_range(where), [partition.lo, partition.hi, *params]
        unbuffered = pymysql.cursors.SSCursor  # rows stream in: a partition may not fit memory
        with connection(self.dsn, cursorclass=unbuffered) as conn, conn.cursor() as cur:
            cur.execute(sql, args)
            while rows := cur.fetchmany(FETCH_ROWS):
                for row in rows:
                    yield tuple(_spark_value(v) for v in row)


def _spark_value(value: Any) -> Any:
    """A value as PyMySQL returns it, as its Spark type takes it."""
    if isinstance(value, timedelta):  # TIME: a duration, read as its text (as MessageStream)
        return format_time(value)
    if isinstance(value, int) and value >= 2**63:  # bigint unsigned: DECIMAL(20,0)
        return Decimal(value)
    return value


# -- batch write (bulk enqueue) ------------------------------------------------------------
@dataclass
class Enqueued(WriterCommitMessage):
    """What one partition's transaction did."""

    partition: int
    inserted: int
    skipped: int


class DuplicateMessage(MsgtableError):
    """A bulk enqueue met an id the table already has (and duplicates were not skipped)."""


class MsgtableWriter(DataSourceWriter):
    """A bulk enqueue: each partition one transaction of multi-row INSERTs in an executor;
    the driver logs what the partitions committed, or after a failure which did."""

    def __init__(self, options: Mapping[str, str], cfg: TableConfig, fields: list[str]) -> None:
        self.dsn = dsn_option(options)
        self.cfg = cfg
        mode = option(options, "onDuplicate", "error").strip().lower()
        if mode not in ("error", "skip"):
            raise InvalidArgument(f"onDuplicate must be error or skip, not {mode!r}")
        self.skip = mode == "skip"
        self.batch_rows = int_option(options, "batchRows", DEFAULT_BATCH_ROWS)
        self.fields = fields
        BulkStatements(cfg).check_enqueue_columns(fields)

    def write(self, iterator: Iterator[Any]) -> Enqueued:
        import pymysql
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        bulk = BulkStatements(self.cfg)
        defaults = bulk.engine_defaults(time.time_ns())
        extra = [c for c in defaults if c not in self.fields]
        columns = [*self.fields, *extra]
        fixed = tuple(defaults[c] for c in extra)
        full_sql = bulk.insert(columns, self.batch_rows, self.skip)
        inserted = total = 0
        with connection(self.dsn, autocommit=False) as conn:
            try:
                with conn.cursor() as cur:
                    chunk: list[Any] = []
                    for row in iterator:
                        chunk.extend(row)
                        chunk.extend(fixed)
                        total += 1
                        if total % self.batch_rows == 0:
                            inserted += cur.execute(full_sql, chunk)
                            chunk = []
                    left = total % self.batch_rows
                    if left:
                        inserted += cur.execute(bulk.insert(columns, left, self.skip), chunk)
                conn.commit()
            except pymysql.err.IntegrityError as exc:
                conn.rollback()
                if error_code(exc) == DUPLICATE_KEY:
                    raise DuplicateMessage(
                        f"partition {partition}: {exc.args[1]}; nothing of this partition was "
                        "enqueued (rerun with .option('onDuplicate', 'skip') to leave ids the "
                        "table has as they are)"
                    ) from None
                raise
            except BaseException:
                conn.rollback()
                raise
        return Enqueued(partition, inserted, total - inserted)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, Enqueued)]
        inserted = sum(m.inserted for m in done)
        skipped = sum(m.skipped for m in done)
        log.warning(
            "msgtable: enqueued %d messages into %s in %d partitions (%d duplicate ids skipped)",
            inserted,
            self.cfg.name,
            len(done),
            skipped,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, Enqueued)]
        log.warning(
            "msgtable: the enqueue into %s failed; %d partitions (%s) committed %d messages "
            "before it did, every other partition none: rerun with onDuplicate=skip to "
            "enqueue the rest once",
            self.cfg.name,
            len(done),
            ", ".join(str(m.partition) for m in done) or "none",
            sum(m.inserted for m in done),
        )
