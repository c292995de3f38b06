"""The engine with its features: the one place that plugs subscriptions, push, capture and
schedules into a MessageEngine (msgtable.engine.components), for ``msgtable serve``, the tests and
the bench alike.
"""

from __future__ import annotations

from typing import Any

from msgtable.engine.components import Features
from msgtable.engine.engine import MessageEngine
from msgtable.features.capture.component import Capture
from msgtable.features.push.allow import AllowList
from msgtable.features.push.pushers import Pushers
from msgtable.features.schedules.component import Schedules
from msgtable.features.subscriptions.registry import Registry
from msgtable.store.mysqlstore import MySQLStore, Store
from msgtable.store.schedules import ScheduleSQL, ScheduleStore


def assemble(
    store: Store,
    *,
    push_allow: AllowList | None = None,
    push_ca_file: str | None = None,
    capture: bool = True,
    schedule_store: ScheduleStore | None = None,
    **engine: Any,
) -> MessageEngine:
    """A MessageEngine on ``store`` (``engine``: its other arguments) serving every feature.

    ``push_allow``: the URLs push endpoints may have (msgtable.features.push.allow; None:
    none), ``push_ca_file`` the CAs their certificates are checked against (None: the
    system's). ``capture``: write table events into capture tables
    (msgtable.features.capture) while this server sends them; they need a MySQL-family
    database. ``schedule_store``: where schedules are on a store other than MySQL's (tests:
    msgtable.testing.schedules)."""
    # each feature's store, as the store offers it (None: a store without that feature)
    subscriptions = store.subscription_store
    endpoints = store.endpoint_store
    events = store.connections() if capture else None
    # schedules (msgtable.features.schedules): in the database's msgtable_schedules table
    schedules = ScheduleSQL(store) if isinstance(store, MySQLStore) else schedule_store
    features = Features(
        subscriptions=lambda host: Registry(host, subscriptions),
        push=lambda host: Pushers(host, endpoints, push_allow, push_ca_file),
        capture=lambda host: Capture(host, events),
        schedules=lambda host: Schedules(host, schedules),
    )
    return MessageEngine(store, features=features, **engine)


def assemble_dsn(dsn: str, **kwargs: Any) -> MessageEngine:
    """``assemble`` on the database at ``dsn`` (a SQLAlchemy URL)."""
    return assemble(MySQLStore.from_dsn(dsn), **kwargs)
