"""The ``msgtable`` Spark data source (PySpark 4's Python Data Source API).

Batch read, ``spark.read.format("msgtable").option("dsn", URL).load(TABLE)``: the table's rows
with its real column types, split into ``partitions`` (default 4) id ranges (an integer id)
or id hash buckets (any other id), optionally only the rows in one ``state``
(msgtable.store.bulk.RowState):

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
``onDuplicate=skip`` is left as it is and counted. The driver logs what each job did. On a
table with vt_dedup (msgtable.core.dedup) a key the table holds (within its window), or a key
twice in one frame, is a duplicate too: it fails its partition, or with ``onDuplicate=skip``
the row is left out and counted among the skipped (the first of a frame's rows with a key goes
in). Rows go in with ``time_created`` the executor's clock, from which the window runs.

A keyspace of shards, ``.option("keyspace", FILE)`` instead of ``dsn``: FILE is a keyspace
file (msgtable.core.keyspace: the keyspace's ``name`` and its ``[[shards]]``, each a ``key_range``
and a ``dsn``); give exactly one of ``dsn`` and ``keyspace`` (MSGTABLE_DSN stands in for
``dsn`` only when neither is given). Every shard must hold the table with the same columns
(names and types), its subscription's state table too for ``subscription``, its
dead-letter table for ``state=dead``; the frame's schema is the first shard's. A table
missing or different on a shard, or a shard that does not answer, fails in one line that
names the shard ("shard 80- of keyspace 'app': no message table 't' in app").

* A read takes every shard at once: its partitions are each shard's own (``partitions`` per
  shard, planned as above, the shards asked in parallel), so one frame holds the rows of
  all the shards, each once; ``state`` and ``subscription`` mean what they mean above, in
  each shard.
* A write sends each row to the shard its ``id`` hashes to (Vitess's ``hash`` vindex,
  msgtable.core.keyspace.Keyspace.shards_of); an id must be an integer 0 to 2**64 - 1, any
  other value fails its partition in one line before anything of it is committed. Each
  partition opens one transaction on each shard it has rows for and commits them one after
  another once all its rows are inserted: a partition's rows are enqueued whole or not at
  all *within a shard*, not across shards. A commit that fails after another shard's went
  through leaves that shard's rows enqueued (the error names the shards that committed;
  rerun with ``onDuplicate=skip``), as Vitess's multi-shard commits are best effort too.
  Duplicate ids fail or are skipped per shard as above; the driver logs how many rows went
  to each shard.

Stream read, ``spark.readStream.format("msgtable").option("server", HOST:PORT).load(TABLE)``:
see msgtable.spark.stream (one server; keyspaces are the batch side's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from itertools import islice
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

from msgtable.core.codec import format_time
from msgtable.core.keyspace import MAX_ID, Keyspace
from msgtable.core.tables import TableConfig
from msgtable.errors import InvalidArgument, MsgtableError
from msgtable.spark.database import (
    Target,
    agreed,
    connection,
    dead_letter_table,
    describe,
    id_bounds,
    on_each,
    restated,
    shard_targets,
    subscription,
)
from msgtable.spark.options import (
    dsn_option,
    int_option,
    keyspace_option,
    option,
    subscription_option,
    table_option,
)
from msgtable.spark.schema import spark_schema
from msgtable.spark.subview import SubscriptionStatements, SubscriptionView
from msgtable.store.bulk import BulkStatements, RowState
from msgtable.store.mysql import DUPLICATE_KEY, error_code

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
        self._targets: tuple[Target, ...] | None = None
        self._keyspace: Keyspace | None = None

    @classmethod
    def name(cls) -> str:
        return "msgtable"

    def targets(self) -> tuple[Target, ...]:
        """The databases a batch read or write reaches: the ``dsn`` option's, or each shard
        of the ``keyspace`` option's keyspace."""
        if self._targets is None:
            self._keyspace = keyspace_option(self.options)
            if self._keyspace is None:
                self._targets = (Target(dsn_option(self.options)),)
            else:
                self._targets = shard_targets(self._keyspace)
        return self._targets

    def config(self) -> TableConfig:
        """The table ``load()`` / ``save()`` names (the first shard's, every shard alike)."""
        if self._config is None:
            table = table_option(self.options)
            self._config = agreed(
                self.targets(),
                lambda dsn: describe(dsn, table),
                lambda cfg: cfg.columns,
                f"message table {table!r}",
            )
        return self._config

    def view(self) -> SubscriptionView | None:
        """The subscription's view a batch read takes (None: the table's own rows)."""
        name = subscription_option(self.options)
        if name and self._view is None:
            cfg = self.config()
            self._view = agreed(
                self.targets(),
                lambda dsn: subscription(dsn, cfg, name),
                lambda view: view.config.columns,
                f"subscription {cfg.name}/{name}'s state table",
            )
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
            self._read_config = agreed(
                self.targets(),
                lambda dsn: dead_letter_table(dsn, cfg),
                lambda dead: dead.columns,
                f"dead-letter table {cfg.dead_letter!r}",
            )
        return self._read_config

    def schema(self) -> str:
        if "server" in self.options and not {"dsn", "keyspace"} & set(self.options):
            from msgtable.spark.stream import stream_schema

            return stream_schema(self.options)
        RowState.parse(option(self.options, "state", "all"))  # bad read options fail at load()
        int_option(self.options, "partitions", DEFAULT_PARTITIONS)
        return spark_schema(self.read_config().columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MsgtableReader(self.options, self.targets(), self.read_config(), self.view())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidArgument("msgtable only appends (enqueues): use mode('append')")
        if subscription_option(self.options):
            raise InvalidArgument(
                "a write enqueues into the table, for every subscription: "
                "option subscription is for reads"
            )
        targets = self.targets()
        return MsgtableWriter(
            self.options, self.config(), schema.fieldNames(), targets, self._keyspace
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from msgtable.spark.stream import MsgtableStreamReader

        return MsgtableStreamReader(self.options, schema)


# -- batch read ----------------------------------------------------------------------------
@dataclass
class Slice(InputPartition):
    """One read partition of target ``shard`` (an index into the reader's targets): ids
    lo..hi (inclusive), or hash bucket ``bucket`` of ``buckets``."""

    lo: Any = None
    hi: Any = None
    bucket: int = 0
    buckets: int = 0
    shard: int = 0


class MsgtableReader(DataSourceReader):
    """A batch read: plans the partitions (id ranges or id hash buckets of each target) on
    the driver, and reads one partition's rows in an executor, with one "now" for every
    partition."""

    def __init__(
        self,
        options: Mapping[str, str],
        targets: Sequence[Target],
        cfg: TableConfig,
        view: SubscriptionView | None = None,
    ) -> None:
        self.targets = tuple(targets)
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
        shards = range(len(self.targets))
        if not self.cfg.id_column.is_integer:
            return [Slice(bucket=k, buckets=n, shard=s) for s in shards for k in range(n)]
        bulk = self.statements()
        where, params = bulk.state(self.state, self.now_ns)
        sql = bulk.id_bounds(where)
        bounds = on_each(self.targets, lambda t: id_bounds(t.dsn, sql, params))
        return [part for s in shards for part in _id_ranges(s, *bounds[s], n)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        import pymysql.cursors

        assert isinstance(partition, Slice)
        target = self.targets[partition.shard]
        bulk = self.statements()
        where, params = bulk.state(self.state, self.now_ns)
        if partition.buckets:
            sql, args = bulk.select_hashed(where), [partition.buckets, partition.bucket, *params]
        else:
            sql, args = bulk.select_range(where), [partition.lo, partition.hi, *params]
        unbuffered = pymysql.cursors.SSCursor  # rows stream in: a partition may not fit memory
        with (
            target.errors(),
            connection(target.dsn, cursorclass=unbuffered) as conn,
            conn.cursor() as cur,
        ):
            cur.execute(sql, args)
            while rows := cur.fetchmany(FETCH_ROWS):
                for row in rows:
                    yield tuple(_spark_value(v) for v in row)


def _id_ranges(shard: int, lo: Any, hi: Any, count: int, n: int) -> list[Slice]:
    """At most ``n`` id ranges of one target, whose ids run from ``lo`` to ``hi``."""
    if not count:
        return [Slice(lo=1, hi=0, shard=shard)]  # an empty range: no rows, the schema holds
    lo, hi = int(lo), int(hi)
    n = max(1, min(n, hi - lo + 1))
    step = (hi - lo + 1) // n
    bounds = [lo + k * step for k in range(n)] + [hi + 1]
    return [Slice(lo=bounds[k], hi=bounds[k + 1] - 1, shard=shard) for k in range(n)]


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
    """What one partition's transactions did; ``shards`` (shard, inserted, skipped) for
    each shard of a keyspace it wrote to."""

    partition: int
    inserted: int
    skipped: int
    shards: tuple[tuple[str, int, int], ...] = ()


class DuplicateMessage(MsgtableError):
    """A bulk enqueue met an id the table already has (and duplicates were not skipped)."""


class MsgtableWriter(DataSourceWriter):
    """A bulk enqueue: each partition one transaction of multi-row INSERTs in an executor on
    each target it has rows for (the one database, or the shards its ids hash to); the
    driver logs what the partitions committed, or after a failure which did."""

    def __init__(
        self,
        options: Mapping[str, str],
        cfg: TableConfig,
        fields: list[str],
        targets: Sequence[Target],
        keyspace: Keyspace | None = None,
    ) -> None:
        self.targets = tuple(targets)
        self.keyspace = keyspace
        self.cfg = cfg
        mode = option(options, "onDuplicate", "error").strip().lower()
        if mode not in ("error", "skip"):
            raise InvalidArgument(f"onDuplicate must be error or skip, not {mode!r}")
        self.skip = mode == "skip"
        self.batch_rows = int_option(options, "batchRows", DEFAULT_BATCH_ROWS)
        self.fields = fields
        BulkStatements(cfg).check_enqueue_columns(fields)
        self.id_index = fields.index(cfg.id_column.name)

    def write(self, iterator: Iterator[Any]) -> Enqueued:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        bulk = BulkStatements(self.cfg)
        defaults = bulk.engine_defaults(time.time_ns())
        extra = [c for c in defaults if c not in self.fields]
        columns = [*self.fields, *extra]
        fixed = tuple(defaults[c] for c in extra)
        full_sql = bulk.insert(columns, self.batch_rows, self.skip)

        def insert(rows: int) -> str:
            return full_sql if rows == self.batch_rows else bulk.insert(columns, rows, self.skip)

        with ExitStack() as stack:
            open_: dict[int, _Transaction] = {}
            try:
                while rows := list(islice(iterator, self.batch_rows)):
                    for k, row in zip(self._route(rows, partition), rows, strict=True):
                        if k not in open_:
                            open_[k] = _Transaction(
                                self.targets[k], stack, insert, partition, self.cfg.dedup
                            )
                        open_[k].add(row, fixed, self.batch_rows)
                for tx in open_.values():
                    tx.flush()
            except BaseException:
                for tx in open_.values():
                    tx.rollback()
                raise
            done = [open_[k] for k in sorted(open_)]
            _commit_each(done, partition)
        inserted = sum(tx.inserted for tx in done)
        skipped = sum(tx.total for tx in done) - inserted
        shards = tuple((tx.target.shard, tx.inserted, tx.total - tx.inserted) for tx in done)
        return Enqueued(partition, inserted, skipped, shards if self.keyspace else ())

    def _route(self, rows: list[Any], partition: int) -> list[int]:
        """Each row's target: the shard its id hashes to (the one database's, 0, without a
        keyspace)."""
        if self.keyspace is None:
            return [0] * len(rows)
        ids = [_keyspace_id_value(row[self.id_index], partition) for row in rows]
        index = {t.shard: k for k, t in enumerate(self.targets)}
        shards = self.keyspace.shards_of(ids)
        key = self.cfg.order_key
        if key and key in self.fields:  # an ordered table's key lives in one shard
            at = self.fields.index(key)
            for row, id_, shard in zip(rows, ids, shards, strict=True):
                if row[at] is not None and (home := self.keyspace.shard_of_key(row[at])) != shard:
                    raise InvalidArgument(
                        f"partition {partition}: id {id_} lives in shard {shard.name} and its "
                        f"key {row[at]!r:.60} in shard {home.name}: a key's messages live in "
                        "one shard (take ids from Keyspace.id_for(key, at_least)); nothing of "
                        "this partition was enqueued"
                    )
        return [index[s.name] for s in shards]

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, Enqueued)]
        inserted = sum(m.inserted for m in done)
        skipped = sum(m.skipped for m in done)
        by_shard = self._by_shard(done)
        log.warning(
            "msgtable: enqueued %d messages into %s in %d partitions (%d duplicate ids skipped)%s",
            inserted,
            self.cfg.name,
            len(done),
            skipped,
            f"; {by_shard}" if by_shard else "",
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, Enqueued)]
        by_shard = self._by_shard(done)
        log.warning(
            "msgtable: the enqueue into %s failed; %d partitions (%s) committed %d messages "
            "before it did%s, every other partition none%s: rerun with onDuplicate=skip to "
            "enqueue the rest once",
            self.cfg.name,
            len(done),
            ", ".join(str(m.partition) for m in done) or "none",
            sum(m.inserted for m in done),
            f" ({by_shard})" if by_shard else "",
            " (a failed one's error names any shard that committed it)" if by_shard else "",
        )

    def _by_shard(self, done: Sequence[Enqueued]) -> str:
        """What went to each shard of the keyspace ("" without one)."""
        if self.keyspace is None:
            return ""
        counts = {t.shard: [0, 0] for t in self.targets}
        for message in done:
            for shard, inserted, skipped in message.shards:
                counts[shard][0] += inserted
                counts[shard][1] += skipped
        each = ", ".join(f"{s} {n} ({k} skipped)" for s, (n, k) in counts.items())
        return f"by shard of keyspace {self.keyspace.name!r}: {each}"


class _Transaction:
    """One partition's transaction on one target: its rows go in by multi-row INSERTs of
    ``batch_rows`` rows, the last one shorter."""

    def __init__(
        self,
        target: Target,
        stack: ExitStack,
        insert: Callable[[int], str],
        partition: int,
        dedup: str = "",
    ) -> None:
        self.target = target
        self.insert = insert
        self.partition = partition
        with target.errors():
            self.conn = stack.enter_context(connection(target.dsn, autocommit=False))
        self.values: list[Any] = []  # the rows not inserted yet, one after another
        # what a duplicate may be besides an id (a vt_dedup table's key: msgtable.core.dedup)
        self.held = f"and vt_dedup keys ({dedup}) " if dedup else ""
        self.pending = self.total = self.inserted = 0

    def add(self, row: Sequence[Any], fixed: tuple[Any, ...], batch_rows: int) -> None:
        self.values.extend(row)
        self.values.extend(fixed)
        self.pending += 1
        self.total += 1
        if self.pending == batch_rows:
            self.flush()

    def flush(self) -> None:
        """Insert the rows not inserted yet."""
        import pymysql

        if not self.pending:
            return
        with self.target.errors():
            try:
                with self.conn.cursor() as cur:
                    self.inserted += cur.execute(self.insert(self.pending), self.values)
            except pymysql.err.IntegrityError as exc:
                if error_code(exc) != DUPLICATE_KEY:
                    raise
                raise DuplicateMessage(
                    f"partition {self.partition}: {exc.args[1]}; nothing of this partition was "
                    "enqueued (rerun with .option('onDuplicate', 'skip') to leave ids "
                    f"{self.held}the table has as they are)"
                ) from None
        self.values, self.pending = [], 0

    def rollback(self) -> None:
        with suppress(Exception):  # the failure that got here says what is wrong
            self.conn.rollback()


def _commit_each(transactions: Sequence[_Transaction], partition: int) -> None:
    """Commit each transaction, one after another; a failed commit says which shards
    committed before it."""
    done: list[str] = []
    for tx in transactions:
        try:
            with tx.target.errors():
                tx.conn.commit()
        except MsgtableError as exc:
            if not done:
                raise
            raise restated(
                exc,
                f"{exc}; partition {partition}'s rows were committed on shards "
                f"{', '.join(done)} before, on no other shard",
            ) from exc
        done.append(tx.target.shard)


def _keyspace_id_value(value: Any, partition: int) -> int:
    """An id as the integer a keyspace hashes: InvalidArgument for any other value."""
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID:
        return value
    raise InvalidArgument(
        f"partition {partition}: id {value!r} has no shard: a keyspace's ids are integers "
        f"0 to {MAX_ID}; nothing of this partition was enqueued"
    )
