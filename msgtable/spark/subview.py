"""The pipeline's SQL of a subscription's view of its message table (msgtable.store.bulk holds the
rest; these are its statements, run on a join): what ``spark.read.format("msgtable")
.option("subscription", NAME)`` reads. Names come from information_schema and are quoted,
values are bound parameters, as in msgtable.store.bulk.

A subscription's view (msgtable.core.subscriptions) is the rows of the message table that were
handed to the subscription, each with the subscription's delivery state: the message table
joined on ``id`` with the state table ``<table>__<name>``. Its columns are the table's, in
the table's order, where each column the state table also has (priority, time_next, epoch,
time_acked, time_created, last_error, time_dead) takes the state table's value, then the
state table's columns the table lacks. So a read's ``state`` means the subscription's state,
as msgtable.store.bulk.RowState defines it for a table; a subscription's dead messages are dead in
place, in its state table. A row not handed to the subscription yet (no state row: the
fan-out has not reached it, or the subscription's filter did not match it) is not in the
view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from msgtable.core.sql import quote
from msgtable.core.subscriptions import state_table_name
from msgtable.core.tables import DEAD_TIME_NEXT, Column, TableConfig
from msgtable.store.bulk import BulkStatements, RowState


@dataclass(frozen=True)
class SubscriptionView:
    """What a read of one subscription takes: ``config`` is the view's (``name`` its state
    table, ``source`` the message table, ``columns`` the view's), ``state_columns`` the
    names of the columns the state table gives it."""

    config: TableConfig
    state_columns: tuple[str, ...]


def subscription_view(
    table: TableConfig, name: str, state_columns: Sequence[Column]
) -> SubscriptionView:
    """The view of subscription ``name`` of ``table``, whose state table has
    ``state_columns``."""
    state = {c.name: c for c in state_columns}
    own = {c.name for c in table.columns}
    columns = (
        *(state.get(c.name, c) for c in table.columns),
        *(c for c in state_columns if c.name not in own),
    )
    config = dataclasses.replace(
        table,
        name=state_table_name(table.name, name),
        columns=columns,
        dead_letter="",  # a subscription's dead messages are dead in place
        fanout=False,
        holders=(),
        source=table.name,
        subscription=name,
    )
    return SubscriptionView(config, tuple(state))


class SubscriptionStatements(BulkStatements):
    """msgtable.store.bulk's read statements of a subscription's view: the same statements, on a
    derived table that joins the state table to the message table (MySQL and MariaDB merge
    it into the outer query, so the id range and the state's condition reach both tables'
    indexes)."""

    def __init__(self, view: SubscriptionView) -> None:
        cfg = view.config
        super().__init__(cfg)
        sid, mid = quote("id"), quote(cfg.id_column.name)
        picks = ", ".join(
            f"{'s' if c in view.state_columns else 'm'}.{quote(c)}" for c in self.columns
        )
        self.table = (
            f"(SELECT {picks} FROM {quote(cfg.name)} AS s JOIN {quote(cfg.source)} AS m "
            f"ON m.{mid} = s.{sid}) AS v"
        )
        self._select = f"SELECT {', '.join(quote(c) for c in self.columns)} FROM {self.table}"

    def state(self, state: RowState, now_ns: int) -> tuple[str, list[Any]]:
        """As a table's (msgtable.store.bulk), but dead always means dead in place: a subscription
        has no dead-letter table, whatever columns its table has."""
        if state is RowState.DEAD:
            return f"{quote('time_acked')} IS NULL AND {quote('time_next')} = %s", [DEAD_TIME_NEXT]
        return super().state(state, now_ns)
