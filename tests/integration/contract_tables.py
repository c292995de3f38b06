"""The adapter of the Store contract (test_store_contract.py): a store, and its tables set up
and read back as another client would, on MySQL through real DDL and DML, in memory through
InMemoryStore's own helpers."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from msgtable.core.tables import (
    DEMO_COMMENT,
    Column,
    Layout,
    TableConfig,
    current_layout_ddl,
    load_table,
)
from msgtable.store.mysqlstore import MySQLStore
from msgtable.store.protocol import Store
from msgtable.testing import CURRENT_COLUMNS, InMemoryStore
from msgtable.testing.devdb import free_port

V2018_SQL = (Path(__file__).parents[2] / "schema" / "v2018.sql").read_text()
V2018_COLUMNS = (
    *(
        Column(n, "bigint", "bigint")
        for n in ("time_scheduled", "id", "time_next", "epoch", "time_created", "time_acked")
    ),
    Column("message", "varchar", "varchar(128)"),
)
V2018_UNIQUE = (("time_scheduled", "id"), ("id",))


class Tables:
    """A store, and its tables set up and read back as another client would: create a message
    table of a schema file's layout (or a plain one), insert, update, delete and read a row
    (without time_created, which the database's clock sets: ``created`` reads it), drop the
    table; ``held``: whether a writer of a row would have to wait now (in memory: for the
    store's lock); ``unreachable``: the store of a database that does not answer."""

    store: Store

    def create(self, name: str, layout: Layout = Layout.CURRENT) -> TableConfig:
        """The table, and its config as the engine loads it (through discover)."""
        self._create(name, layout)
        (d,) = [d for d in self.store.discover() if d.name == name]
        return load_table(d.name, d.comment, d.columns, d.unique_indexes)

    def create_with(self, name: str, comment: str, extra: dict[str, str]) -> TableConfig:
        """A current-layout table with ``extra`` columns (name -> SQL type) and a comment."""
        self._create_with(name, comment, extra)
        (d,) = [d for d in self.store.discover() if d.name == name]
        return load_table(d.name, d.comment, d.columns, d.unique_indexes)

    def create_ordered(self, name: str) -> TableConfig:
        """A current-layout table ordered by its varchar column ``k`` (vt_order_key=k, with
        the index order_idx (k, time_acked, id)), vt_batch_size=10."""
        self._create_ordered(name, DEMO_COMMENT + ",vt_order_key=k")
        (d,) = [d for d in self.store.discover() if d.name == name]
        return load_table(d.name, d.comment, d.columns, d.unique_indexes, d.indexes)

    def _create_ordered(self, name: str, comment: str) -> None: ...
    def _create(self, name: str, layout: Layout) -> None: ...
    def _create_with(self, name: str, comment: str, extra: dict[str, str]) -> None: ...
    def created(self, table: str, id: Hashable) -> int | None: ...
    def create_plain(self, name: str, comment: str) -> None: ...
    def insert(self, table: str, id: Hashable, **values: Any) -> None: ...
    def row(self, table: str, id: Hashable) -> dict[str, Any] | None: ...
    def update(self, table: str, id: Hashable, **values: Any) -> None: ...
    def delete(self, table: str, id: Hashable) -> None: ...
    def drop(self, table: str) -> None: ...
    def held(self, table: str, id: Hashable) -> bool: ...
    def unreachable(self) -> Store: ...


class MemoryTables(Tables):
    def __init__(self) -> None:
        self.store = self.memory = InMemoryStore()

    def _create(self, name: str, layout: Layout) -> None:
        if layout is Layout.CURRENT:
            self.memory.create_table(name, DEMO_COMMENT)
        else:
            self.memory.create_table(name, DEMO_COMMENT, V2018_COLUMNS, V2018_UNIQUE)

    def _create_with(self, name: str, comment: str, extra: dict[str, str]) -> None:
        more = tuple(Column(n, t.partition("(")[0], t) for n, t in extra.items())
        self.memory.create_table(name, comment, CURRENT_COLUMNS + more)

    def create_plain(self, name: str, comment: str) -> None:
        self.memory.create_table(name, comment, (Column("id", "bigint", "bigint"),), (("id",),))

    def _create_ordered(self, name: str, comment: str) -> None:
        self.memory.create_table(
            name,
            comment,
            (*CURRENT_COLUMNS, Column("k", "varchar", "varchar(64)")),
            indexes=(("order_idx", ("k", "time_acked", "id")),),
        )

    def row(self, table: str, id: Hashable) -> dict[str, Any] | None:
        row = self.memory.rows[table].get(id)
        columns = self.memory.definitions[table].columns
        if row is None:
            return None
        return {c.name: row[c.name] for c in columns if c.name != "time_created"}

    def created(self, table: str, id: Hashable) -> int | None:
        value: int | None = self.memory.rows[table][id]["time_created"]
        return value

    def insert(self, table: str, id: Hashable, **values: Any) -> None:
        self.memory.insert(table, id, **values)

    def update(self, table: str, id: Hashable, **values: Any) -> None:
        self.memory.update(table, id, **values)

    def delete(self, table: str, id: Hashable) -> None:
        self.memory.delete(table, id)

    def drop(self, table: str) -> None:
        self.memory.drop_table(table)

    def held(self, table: str, id: Hashable) -> bool:
        if not self.memory.lock.acquire(blocking=False):
            return True
        self.memory.lock.release()
        return False

    def unreachable(self) -> Store:
        down = InMemoryStore()
        down.down = True
        return down


class MySQLTables(Tables):
    def __init__(self, sql: Any, dsn: str) -> None:
        self.sql, self.store = sql, MySQLStore.from_dsn(dsn)

    def _create(self, name: str, layout: Layout) -> None:
        if layout is Layout.CURRENT:
            self.sql.execute(current_layout_ddl(name, DEMO_COMMENT))
        else:
            lines = [s for s in V2018_SQL.splitlines() if not s.startswith("--")]
            self.sql.execute(
                "\n".join(lines)
                .replace("old_message", name)
                .replace("if not exists ", "")
                .rstrip()
                .rstrip(";")
            )

    def _create_with(self, name: str, comment: str, extra: dict[str, str]) -> None:
        columns = ",\n  ".join(f"{n} {t}" for n, t in extra.items())
        ddl = current_layout_ddl(name, comment)
        self.sql.execute(ddl.replace("  primary key(id)", f"  {columns},\n  primary key(id)"))

    def create_plain(self, name: str, comment: str) -> None:
        self.sql.execute(f"create table {name}(id bigint primary key) comment '{comment}'")

    def _create_ordered(self, name: str, comment: str) -> None:
        extra = "k varchar(64),\n  index order_idx (k, time_acked, id),\n  primary key(id)"
        ddl = current_layout_ddl(name, comment).replace("  primary key(id)", "  " + extra)
        self.sql.execute(ddl)

    def insert(self, table: str, id: Hashable, **values: Any) -> None:
        values = {"id": id, **values}
        names = ", ".join(values)
        self.sql.execute(f"insert into {table}({names}) values (:{', :'.join(values)})", values)

    def row(self, table: str, id: Hashable) -> dict[str, Any] | None:
        found = self.sql.execute(f"select * from {table} where id = :id", {"id": id})
        row = found.mappings().first()
        if row is None:
            return None
        return {k: v for k, v in row.items() if k != "time_created"}

    def created(self, table: str, id: Hashable) -> int | None:
        value = self.sql.scalar(f"select time_created from {table} where id = :id", {"id": id})
        return None if value is None else int(value)

    def update(self, table: str, id: Hashable, **values: Any) -> None:
        sets = ", ".join(f"{k} = :{k}" for k in values)
        self.sql.execute(f"update {table} set {sets} where id = :id", {**values, "id": id})

    def delete(self, table: str, id: Hashable) -> None:
        self.sql.execute(f"delete from {table} where id = :id", {"id": id})

    def drop(self, table: str) -> None:
        self.sql.execute(f"drop table {table}")

    def held(self, table: str, id: Hashable) -> bool:
        with self.sql.engine.connect() as conn:
            try:
                conn.execute(
                    sa.text(f"select id from {table} where id = :id for update nowait"), {"id": id}
                )
            except sa.exc.OperationalError:
                return True
            return False

    def unreachable(self) -> Store:
        return MySQLStore.from_dsn(f"mysql://nobody@127.0.0.1:{free_port()}/nothing")


@pytest.fixture(params=["memory", "mysql"], name="tables")
def both_stores(request: pytest.FixtureRequest) -> Iterator[Tables]:
    """The same cases on InMemoryStore and on MySQLStore (a fresh database per test): the
    contract suites' ``tables``."""
    if request.param == "memory":
        yield MemoryTables()
        return
    t = MySQLTables(request.getfixturevalue("sql"), request.getfixturevalue("db_dsn"))
    yield t
    t.store.close()
