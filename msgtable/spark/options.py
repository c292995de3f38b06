"""The ``format("msgtable")`` data source's options, read and checked in one place for its batch
(msgtable.spark.source) and stream (msgtable.spark.stream) sides: a bad option is an
InvalidArgument that names it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from msgtable.core import keyspace
from msgtable.core.keyspace import Keyspace
from msgtable.core.subscriptions import check_name, parse_columns
from msgtable.errors import InvalidArgument
from msgtable.limits import DEFAULT_ADDRESS


def option(options: Mapping[str, str], name: str, default: str | None = None) -> str:
    """An option by case-insensitive name (Spark passes them so already)."""
    value = options.get(name, options.get(name.lower(), default))
    if value is None:
        raise InvalidArgument(f"the msgtable data source needs the option {name!r}")
    return value


def int_option(options: Mapping[str, str], name: str, default: int, low: int = 1) -> int:
    """A whole-number option, at least ``low``."""
    raw = option(options, name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"option {name} must be a whole number, not {raw!r}") from None
    if value < low:
        raise InvalidArgument(f"option {name} must be at least {low}, not {value}")
    return value


def table_option(options: Mapping[str, str]) -> str:
    """The message table: ``.load(TABLE)`` (Spark's ``path``) or ``.option("table", ...)``."""
    name = options.get("table") or options.get("path")
    if not name:
        raise InvalidArgument("name the message table: .load(TABLE) or .option('table', ...)")
    return name


def dsn_option(options: Mapping[str, str]) -> str:
    """The database URL of a batch read or write: ``dsn``, else MSGTABLE_DSN."""
    dsn = options.get("dsn") or os.environ.get("MSGTABLE_DSN")
    if not dsn:
        raise InvalidArgument(
            "the msgtable data source needs .option('dsn', URL) (or MSGTABLE_DSN) or "
            ".option('keyspace', FILE)"
        )
    return dsn


def keyspace_option(options: Mapping[str, str]) -> Keyspace | None:
    """The keyspace a batch read or write spans, from the keyspace file ``keyspace`` names
    (msgtable.core.keyspace); None for the one database of ``dsn`` (dsn_option). Exactly one of
    the two options: MSGTABLE_DSN stands in for ``dsn`` only when neither is given."""
    path = options.get("keyspace")
    if not path:
        return None
    if options.get("dsn"):
        raise InvalidArgument(
            "give the msgtable data source one of .option('dsn', URL) and "
            ".option('keyspace', FILE), not both"
        )
    return keyspace.load(path)


def server_option(options: Mapping[str, str]) -> str:
    """The msgtable server a stream subscribes to: ``server``, else MSGTABLE_SERVER, else the
    default address."""
    return options.get("server") or os.environ.get("MSGTABLE_SERVER") or DEFAULT_ADDRESS


def subscription_option(options: Mapping[str, str]) -> str:
    """The subscription (consumer group) a read or stream takes, by name: ``subscription``;
    "" (the default) is the table's own, default group."""
    name = option(options, "subscription", "").strip()
    return check_name(name) if name else ""


def columns_option(options: Mapping[str, str]) -> tuple[str, ...]:
    """The message columns a stream asks for (``id,kind,amount`` or ``id|kind``: the id
    comes first whether named or not); () for all of them."""
    return parse_columns(option(options, "columns", ""))
