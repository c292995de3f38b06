"""The ``msgtable`` command's commands and flags, declared as data, and the parser built from
them. Every flag that has an environment variable names it here (``MSGTABLE_*``), and that
variable is its default."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from msgtable import __version__
from msgtable.core.tables import DEFAULT_DISCOVERY_INTERVAL_S
from msgtable.limits import (
    DEFAULT_ADDRESS,
    DEFAULT_GATEWAY_TIMEOUT_S,
    DEFAULT_GRACE_S,
    DEFAULT_LEASE_PERIOD_S,
    DEFAULT_MAX_STREAMS_PER_CLIENT,
    DEFAULT_MAX_SUBSCRIBERS_PER_TABLE,
    DEFAULT_REDRIVE_BATCH,
    MAX_REDRIVE_BATCH,
)


# -- value types ---------------------------------------------------------------------------
def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, not {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be more than zero, not {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be zero or more, not {text}")
    return value


def rate(text: str) -> float:
    """A rate per second: ``100`` or ``100/s``."""
    raw = text.strip().removesuffix("/s")
    return positive_float(raw)


def duration(text: str) -> float:
    """Seconds from "90", "90s", "15m", "12h" or "7d"."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    raw = text.strip().lower()
    scale = units.get(raw[-1:], 0)
    try:
        value = float(raw[:-1] if scale else raw) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration (90s, 15m, 12h, 7d): {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be zero or more, not {text}")
    return value


def switched_on(text: str) -> bool:
    """An on/off environment variable: on unless it says 0, false, no or off."""
    return text.strip().lower() not in ("0", "false", "no", "off")


# -- declarations ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Flag:
    """One argument of a command. ``env``: the environment variable its default comes from
    (a ``switch`` reads it as on/off); ``default`` when that is unset."""

    name: str  # "--dsn", or "name" for a positional argument
    help: str
    env: str | None = None
    default: Any = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    switch: bool = False  # --x / --no-x
    store_true: bool = False
    required: bool = False
    choices: tuple[str, ...] | None = None
    optional: bool = False  # a positional argument that may be left out (then ``default``)

    @property
    def help_text(self) -> str:
        """The help, naming the environment variable beside the default it replaces."""
        text, env = self.help, self.env
        if not env:
            return text
        if self.switch:  # what the variable is set to, to turn it from its default
            return f"{text} (env {env}={0 if self.default else 1})"
        at = text.rfind("(default ")
        if at >= 0 and text.endswith(")"):
            return f"{text[:at]}(env {env}; {text[at + 1 :]}"
        return f"{text} (env {env})"

    def add_to(self, parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
        default = self.default
        if self.env and environ.get(self.env):
            raw = environ[self.env]
            default = switched_on(raw) if self.switch else raw
        options: dict[str, Any] = {"help": self.help_text}
        if self.switch:
            options.update(action=argparse.BooleanOptionalAction, default=default)
        elif self.store_true:
            options.update(action="store_true")
        else:
            if not self.name.startswith("-"):
                if self.optional:
                    options.update(nargs="?", default=default, metavar=self.metavar)
                parser.add_argument(self.name, **options)
                return
            options.update(default=default, type=self.type, metavar=self.metavar)
            if self.required:
                options["required"] = True
            if self.choices:
                options["choices"] = self.choices
        parser.add_argument(self.name, **options)


def parse_columns(text: str) -> tuple[str, ...]:
    """--columns: core.subscriptions' parse_columns, imported when a command gets the flag
    (that module brings the filter language, which the other commands do without)."""
    from msgtable.core import subscriptions

    return subscriptions.parse_columns(text)


@dataclass(frozen=True)
class Command:
    """A command, or a group of them (``msgtable subscription create``): a group has
    ``subcommands`` and no flags of its own; its chosen one is ``args.action``."""

    name: str
    help: str
    description: str
    flags: tuple[Flag, ...] = ()
    subcommands: tuple[Command, ...] = ()

    def leaves(self) -> list[tuple[tuple[str, ...], Command]]:
        """The commands that run, with the words that name them (``("subscription",
        "create")``)."""
        if not self.subcommands:
            return [((self.name,), self)]
        return [((self.name, *words), c) for s in self.subcommands for words, c in s.leaves()]


SERVER_FLAG = Flag(
    "--server",
    f"msgtable server HOST:PORT (default {DEFAULT_ADDRESS})",
    env="MSGTABLE_SERVER",
    default=DEFAULT_ADDRESS,
)
CLIENT_FLAGS = (
    SERVER_FLAG,
    Flag("--token", "bearer token for a server with --auth", env="MSGTABLE_TOKEN", metavar="TOKEN"),
    Flag("--tls-ca", "connect with TLS, trusting this CA", env="MSGTABLE_TLS_CA", metavar="PEM"),
)
DSN_FLAG = Flag("--dsn", "SQLAlchemy URL of the database", env="MSGTABLE_DSN")
SPARK_MASTER_FLAG = Flag(
    "--master",
    "Spark master (default local[*]; SPARK_REMOTE selects Spark Connect instead); needs "
    "pip install 'msgtable[spark]'",
)

KEYSPACE_FILE_FLAG = Flag(
    "--keyspace-file",
    "a keyspace of shards (TOML: name, and [[shards]] with key_range, dsn, servers; see "
    "docs/how-to/keyspaces.md)",
    env="MSGTABLE_KEYSPACE_FILE",
    metavar="FILE",
)
LISTEN_FLAG = Flag(
    "--listen",
    "HOST:PORT to listen on; elsewhere than loopback, use --tls-cert and --auth "
    f"(default {DEFAULT_ADDRESS})",
    env="MSGTABLE_LISTEN",
    default=DEFAULT_ADDRESS,
)

SECURITY_FLAGS = (
    Flag(
        "--auth",
        "tokens, client certificate names and per-table rules (TOML; see docs/how-to/security.md); "
        "without it every caller may do everything",
        env="MSGTABLE_AUTH",
        metavar="FILE",
    ),
    Flag(
        "--tls-cert",
        "the server's certificate: serve TLS",
        env="MSGTABLE_TLS_CERT",
        metavar="PEM",
    ),
    Flag("--tls-key", "the server certificate's key", env="MSGTABLE_TLS_KEY", metavar="PEM"),
    Flag(
        "--tls-client-ca",
        "require client certificates signed by this CA",
        env="MSGTABLE_TLS_CLIENT_CA",
        metavar="PEM",
    ),
)
STOPPING_FLAGS = (
    Flag(
        "--grace-s",
        f"on SIGINT/SIGTERM, seconds to let calls in flight finish (default {DEFAULT_GRACE_S:g})",
        default=DEFAULT_GRACE_S,
        type=non_negative_float,
    ),
    Flag(
        "--log-level",
        "(default info)",
        env="MSGTABLE_LOG_LEVEL",
        default="info",
        type=str.lower,
        choices=("debug", "info", "warning", "error"),
    ),
)

SERVE = Command(
    "serve",
    "run the server",
    "Serve the message tables of one database over gRPC. Without a DSN, start a throwaway "
    "local MariaDB/MySQL server with a demo table (deleted on exit).",
    (
        Flag(
            "--dsn",
            "SQLAlchemy URL of the database, e.g. mysql+pymysql://user:password@host:3306/db",
            env="MSGTABLE_DSN",
        ),
        KEYSPACE_FILE_FLAG,
        Flag(
            "--shard",
            "with --keyspace-file: the shard this server sends (its key range, e.g. -80); its "
            "database is the file's DSN of that shard",
            env="MSGTABLE_SHARD",
            metavar="NAME",
        ),
        LISTEN_FLAG,
        Flag(
            "--discovery-interval",
            "seconds between looks for new, changed and dropped message tables (default "
            f"{DEFAULT_DISCOVERY_INTERVAL_S:g})",
            env="MSGTABLE_DISCOVERY_INTERVAL",
            default=str(DEFAULT_DISCOVERY_INTERVAL_S),
            type=positive_float,
        ),
        Flag(
            "--binlog",
            "follow the database's binlog (the default), so rows written by any client go out "
            "at once, not at the next poll; it needs a ROW binlog and REPLICATION SLAVE + "
            "REPLICATION CLIENT, and without them the server says why once and polls. "
            "--no-binlog polls only",
            env="MSGTABLE_BINLOG",
            default=True,
            switch=True,
        ),
        Flag(
            "--lease",
            "share the database with other msgtable servers (the default): the servers share "
            "its tables, each sent by the one holding its lease (the table "
            "msgtable_placement); the others answer its subscribers with UNAVAILABLE and that "
            "server's address. --no-lease: this server is the only one",
            env="MSGTABLE_LEASE",
            default=True,
            switch=True,
        ),
        Flag(
            "--lease-period",
            "how long a table's lease lasts unless renewed; another server takes over within two "
            f"(default {DEFAULT_LEASE_PERIOD_S:g})",
            env="MSGTABLE_LEASE_PERIOD",
            default=str(DEFAULT_LEASE_PERIOD_S),
            type=positive_float,
            metavar="SECONDS",
        ),
        Flag(
            "--metrics-listen",
            "serve Prometheus metrics at http://HOST:PORT/metrics (default off)",
            env="MSGTABLE_METRICS_LISTEN",
            metavar="HOST:PORT",
        ),
        Flag(
            "--http",
            "serve the live dashboard at http://HOST:PORT/ (default off; with --auth it asks "
            "for a token; without, bind it to a private address)",
            env="MSGTABLE_HTTP",
            metavar="HOST:PORT",
        ),
        Flag(
            "--sqs-listen",
            "serve an Amazon SQS-compatible API (its JSON protocol, what the AWS SDKs speak) at "
            "http://HOST:PORT/ (default off; with --auth, requests are signed by the auth "
            "file's [access_keys])",
            env="MSGTABLE_SQS_LISTEN",
            metavar="HOST:PORT",
        ),
        Flag(
            "--sqs-max-message-bytes",
            "the SQS API's largest message: body and attributes (default 262,144, SQS's; at "
            "most what the message column holds)",
            env="MSGTABLE_SQS_MAX_MESSAGE_BYTES",
            default="262144",
            type=positive_int,
            metavar="BYTES",
        ),
        Flag(
            "--sqs-manage",
            "let the SQS API's CreateQueue, DeleteQueue and PurgeQueue create, drop and empty "
            "message tables: DDL in your database (default off; with --auth, the manage right)",
            env="MSGTABLE_SQS_MANAGE",
            default=False,
            switch=True,
        ),
        Flag(
            "--advertise",
            "the address other servers send clients to when this one leads (default the "
            "listen address, or this host's name on a wildcard)",
            env="MSGTABLE_ADVERTISE",
            metavar="HOST:PORT",
        ),
        *SECURITY_FLAGS,
        Flag(
            "--push-allow",
            "the URLs push endpoints may have, comma separated: scheme://host[:port], "
            "scheme://*.domain, scheme://CIDR (e.g. https://*.example.com,http://10.1.0.0/16); "
            "default none: nothing is pushed",
            env="MSGTABLE_PUSH_ALLOW",
            default="",
            metavar="LIST",
        ),
        Flag(
            "--push-ca-file",
            "the CA certificates HTTPS endpoints are checked against (default the system's)",
            env="MSGTABLE_PUSH_CA_FILE",
            metavar="PEM",
        ),
        Flag(
            "--max-subscribers-per-table",
            f"then RESOURCE_EXHAUSTED (default {DEFAULT_MAX_SUBSCRIBERS_PER_TABLE:,})",
            default=DEFAULT_MAX_SUBSCRIBERS_PER_TABLE,
            type=positive_int,
            metavar="N",
        ),
        Flag(
            "--max-streams-per-client",
            "streams of one principal (or, without --auth, one address); then "
            f"RESOURCE_EXHAUSTED (default {DEFAULT_MAX_STREAMS_PER_CLIENT})",
            default=DEFAULT_MAX_STREAMS_PER_CLIENT,
            type=positive_int,
            metavar="N",
        ),
        *STOPPING_FLAGS,
    ),
)
GATEWAY = Command(
    "gateway",
    "serve a keyspace of shards on one endpoint",
    "Serve every shard of a keyspace on one endpoint, as Vitess's vtgate: a stream of a "
    "table merges its shards' streams, each ack goes to the shard of its id. The gateway "
    "reaches each shard's servers (msgtable serve --keyspace-file FILE --shard NAME) at the "
    "addresses the keyspace file names, and starts only when every shard answers with the "
    "same message tables.",
    (
        KEYSPACE_FILE_FLAG,
        LISTEN_FLAG,
        Flag(
            "--shard-token",
            "bearer token for shard servers with --auth",
            env="MSGTABLE_SHARD_TOKEN",
            metavar="TOKEN",
        ),
        Flag(
            "--shard-tls-ca",
            "reach the shard servers with TLS, trusting this CA",
            env="MSGTABLE_SHARD_TLS_CA",
            metavar="PEM",
        ),
        Flag(
            "--shard-tls-cert",
            "a client certificate for shard servers that require one (with --shard-tls-key)",
            env="MSGTABLE_SHARD_TLS_CERT",
            metavar="PEM",
        ),
        Flag(
            "--shard-tls-key",
            "the key of --shard-tls-cert",
            env="MSGTABLE_SHARD_TLS_KEY",
            metavar="PEM",
        ),
        Flag(
            "--timeout",
            "seconds a shard has to answer a call, or to open a stream "
            f"(default {DEFAULT_GATEWAY_TIMEOUT_S:g})",
            env="MSGTABLE_GATEWAY_TIMEOUT",
            default=DEFAULT_GATEWAY_TIMEOUT_S,
            type=positive_float,
            metavar="SECONDS",
        ),
        Flag(
            "--metrics-listen",
            "serve the gateway's Prometheus metrics at http://HOST:PORT/metrics (default off)",
            env="MSGTABLE_GATEWAY_METRICS_LISTEN",
            metavar="HOST:PORT",
        ),
        *SECURITY_FLAGS,
        *STOPPING_FLAGS,
    ),
)
TABLES = Command(
    "tables",
    "list message tables",
    "List every message table the server knows: configuration or load error, and live "
    "counters; then, under each table that has subscriptions, how many of its rows are not "
    "handed to them yet (unseen) and each subscription's state, subscribers, lag, the age of "
    "its oldest unsettled message and whether it holds the table's purge (and if not, why). "
    "The table shows the columns that fit an 80-column terminal; --wide shows all of them, "
    "--json every field.",
    (
        Flag(
            "--wide",
            "every column: the settings (batch, cache, ack wait, max attempts) and every "
            "counter (cached, released, rejected, renewed, died)",
            store_true=True,
        ),
        Flag(
            "--json",
            "one JSON object per line for each table and subscription, with every field "
            "(ages in seconds, times in unix nanoseconds)",
            store_true=True,
        ),
        *CLIENT_FLAGS,
    ),
)
TAIL = Command(
    "tail",
    "print messages as they arrive",
    "Subscribe to a message table and print each message (id and columns) as it arrives, "
    "until Ctrl-C; a redelivery ends with (attempt N). Without --ack the messages are not "
    "acknowledged, so they are sent again after the table's ack wait. With --count N the "
    "server sends at most N, so none is left in flight unseen. With --subscription NAME, tail "
    "reads that subscription's queue instead of the table's default group (and --ack acks "
    "there): only the messages its filter let in, with its columns.",
    (
        Flag("name", "message table"),
        Flag("--keyspace", "keyspace (database); default the server's", default=""),
        Flag(
            "--subscription",
            "read as this subscription of the table (msgtable subscription list shows them); "
            "default the table's default group",
            default="",
            metavar="NAME",
        ),
        Flag(
            "--columns",
            "only these message columns, comma separated (id always comes first); default "
            "the table's, or the subscription's",
            type=parse_columns,
            metavar="COL,COL,...",
        ),
        Flag("--ack", "acknowledge each batch once printed", store_true=True),
        Flag("--count", "exit after N messages", type=positive_int, metavar="N"),
        Flag(
            "--json",
            "one JSON object per line (DECIMAL as a string, binary as 0x hex; a redelivery's "
            "_attempt, and with --time _sent)",
            store_true=True,
        ),
        Flag("--time", "show when the server sent each message", store_true=True),
        *CLIENT_FLAGS,
    ),
)
ARCHIVE = Command(
    "archive",
    "copy old acked rows to Parquet, then delete them",
    "Copy the rows of message table NAME acked more than --older-than ago to Parquet under "
    "PATH (partitioned by the UTC day they were acked), check the copy's row count, then "
    "delete exactly the copied rows. A crash at any point loses nothing, and a rerun finishes "
    "what was left without copying anything twice.",
    (
        Flag("name", "message table"),
        Flag("--to", "the archive's directory", metavar="PATH", required=True),
        Flag(
            "--older-than",
            "archive rows acked more than this long ago: 90s, 15m, 12h, 7d (default 1d)",
            default=86400.0,
            type=duration,
            metavar="AGE",
        ),
        DSN_FLAG,
        SPARK_MASTER_FLAG,
    ),
)
REPORT = Command(
    "report",
    "delivery statistics of a message table or an archive",
    "Delivery latency percentiles (created -> acked, where the table has time_created), "
    "redeliveries by epoch, backlog by age and priority, and throughput (per minute, hour or "
    "day, as suits the time the acks span), of message table NAME (or of the archive at "
    "--archive PATH): tables in the terminal and an HTML page with plots that needs nothing "
    "from the internet.",
    (
        Flag("name", "message table (or a title, with --archive)"),
        Flag("--archive", "read this archive", metavar="PATH"),
        Flag("--html", "default NAME-report.html", metavar="FILE"),
        DSN_FLAG,
        SPARK_MASTER_FLAG,
    ),
)
DEAD = Command(
    "dead",
    "list dead letters and why they died",
    "List the dead messages of message table NAME (in its vt_dead_letter table, or dead in "
    "place), or the rows of dead-letter table NAME: id, when it died, how many times it was "
    "sent, and its last error; and how many there are.",
    (
        Flag("name", "message table or dead-letter table"),
        Flag("--keyspace", "keyspace (database); default the server's", default=""),
        Flag(
            "--limit", "show at most N (default 100)", default=100, type=positive_int, metavar="N"
        ),
        Flag(
            "--subscription",
            "the dead messages of this subscription of the table (dead in its state table)",
            default="",
            metavar="NAME",
        ),
        *CLIENT_FLAGS,
    ),
)
REDRIVE = Command(
    "redrive",
    "move dead letters back as fresh messages",
    "Move the dead messages of NAME back as fresh messages (attempts reset, due now), batch by "
    "batch, each batch one transaction: an interrupted redrive can be run again and moves "
    "nothing twice. NAME is a dead-letter table (its messages go back to the table whose "
    "vt_dead_letter it is, or to --to), a table with vt_dead_letter (its dead letters come "
    "back), or a table whose messages are dead in place; with --subscription, the dead "
    "messages of that subscription of table NAME live again for it alone. An id the target "
    "has again is skipped and left dead. A progress bar on a terminal; the count at the end.",
    (
        Flag("name", "dead-letter table (or a table, see above)"),
        Flag("--to", "the table they go to (default: see above)", default="", metavar="TABLE"),
        Flag(
            "--subscription",
            "the dead messages of this subscription of table NAME (not with --to)",
            default="",
            metavar="SUB",
        ),
        Flag("--ids", "only these ids, comma separated", metavar="ID,ID,..."),
        Flag("--limit", "move at most N", type=positive_int, metavar="N"),
        Flag("--rate", "at most N a second: 100, 100/s", type=rate, metavar="N/s"),
        Flag(
            "--batch",
            f"messages per transaction (default {DEFAULT_REDRIVE_BATCH}, at most "
            f"{MAX_REDRIVE_BATCH:,})",
            default=DEFAULT_REDRIVE_BATCH,
            type=positive_int,
            metavar="N",
        ),
        Flag("--keyspace", "keyspace (database); default the server's", default=""),
        *CLIENT_FLAGS,
    ),
)


# -- subscriptions -------------------------------------------------------------------------------
# Flow control of its own (docs/how-to/flow-control.md): each flag is the comment's vt_<name>
LIMIT_FLAGS = (
    ("rate", "N/s", "at most N messages a second (N/m, N/h) sent to its subscribers"),
    ("rate_burst", "N", "bursts of at most N messages (default a tenth of a second's worth)"),
    ("max_in_flight", "N", "at most N messages in flight (sent, not settled nor expired)"),
    ("key_rate", "N/s", "at most N messages a second per value of the table's vt_limit_key"),
    ("key_burst", "N", "bursts of at most N per key (default a tenth of a second's worth)"),
    ("key_concurrency", "N", "at most N in flight per value of the table's vt_limit_key"),
)


def _limit_flags(alter: bool) -> tuple[Flag, ...]:
    way = "; '' puts the table's back" if alter else " (default the table's)"
    return tuple(
        Flag(
            f"--{name.replace('_', '-')}",
            f"{text}, in place of the table's vt_{name}; off: none for this subscription{way}",
            metavar=metavar,
        )
        for name, metavar, text in LIMIT_FLAGS
    )


def _settings_flags(alter: bool) -> tuple[Flag, ...]:
    """A subscription's settings as create and alter take them. Left out: create takes the
    default, alter keeps the current value (so no flag has a default of its own)."""

    def text(create: str, altered: str) -> str:
        return altered if alter else create

    return (
        Flag(
            "--filter",
            "only the messages that match it: a selector (region IN ('eu','us') AND amount > "
            "10) or an ODPS matcher (region=eu|us,kind=order) over the table's columns; a bad "
            "one is refused with the position of the problem"
            + text(
                " (default every message)",
                "; a new one applies to the messages handed over from now on; '' clears it",
            ),
            metavar="TEXT",
        ),
        Flag(
            "--columns",
            "the columns its messages carry, comma separated, id always first"
            + text(" (default the table's message columns)", "; '' clears it: all of them"),
            type=parse_columns,
            metavar="COL,COL,...",
        ),
        Flag(
            "--ack-wait",
            "how long a message sent and not acked waits before it is sent again: 30, 90s, 15m"
            + text(" (default the table's vt_ack_wait)", "; 0: the table's vt_ack_wait"),
            type=duration,
            metavar="S",
        ),
        Flag(
            "--max-attempts",
            "sends after which an unacked message is dead (kept in the subscription's state "
            "table); 0: no limit" + text(" (default the table's vt_max_attempts)", ""),
            type=non_negative_int,
            metavar="N",
        ),
        Flag(
            "--max-lag",
            "unsettled messages past which it no longer holds the table's purge, and the rows "
            "it has not settled may be purged from under it"
            + text(" (default no limit)", "; 0: no limit"),
            type=non_negative_int,
            metavar="N",
        ),
        Flag(
            "--expire-after",
            "with no subscriber this long (90s, 15m, 12h, 7d) it expires: it gets no new "
            "messages and holds nothing until a subscriber comes back"
            + text(" (default never)", "; 0: never; a change makes an expired one active"),
            type=duration,
            metavar="S",
        ),
        *_limit_flags(alter),
    )


SUBSCRIPTION_TABLE = Flag("table", "message table")
SUBSCRIPTION_NAME = Flag(
    "name", "the subscription: 1-64 letters, digits or underscores (its state table is TABLE__NAME)"
)
KEYSPACE_FLAG = Flag("--keyspace", "keyspace (database); default the server's", default="")
WHERE_THEY_LIVE = (
    "The definitions live in the database (table msgtable_subscriptions), so every msgtable "
    "server of it serves the same ones: the server that takes a change applies it at once, "
    "the others at their next discovery (serve --discovery-interval, default "
    f"{DEFAULT_DISCOVERY_INTERVAL_S:g}s)."
)
SUBSCRIPTION = Command(
    "subscription",
    "create, alter, drop and list subscriptions",
    "A subscription is a named consumer group of a message table: it gets every message "
    "(that matches its filter) as a work queue of its own, with its own acks, attempts and "
    "dead messages, beside the table's default group. Read one with msgtable tail TABLE "
    f"--subscription NAME. {WHERE_THEY_LIVE}",
    subcommands=(
        Command(
            "create",
            "create a subscription",
            "Create subscription NAME of message table TABLE, with its state table "
            "TABLE__NAME (TABLE gets a time_fanout column and index if it has none). It gets "
            "the messages enqueued from now on that match --filter; with --from-start also "
            "the retained ones the default group has not acked. A bad filter, column or "
            "setting is refused, saying what and where, and nothing is written. Settings left "
            f"out take the table's. {WHERE_THEY_LIVE}",
            (
                SUBSCRIPTION_TABLE,
                SUBSCRIPTION_NAME,
                *_settings_flags(alter=False),
                Flag(
                    "--from-start",
                    "also every retained message the default group has not acked (default "
                    "only the messages enqueued from now on)",
                    store_true=True,
                ),
                Flag(
                    "--state-rows",
                    "lazy: a state row only for a message sent and not settled in order (the "
                    "others read from TABLE behind the subscription's cursor; ack over gRPC, "
                    "not by DML yet); eager (default): one for every message",
                    choices=("eager", "lazy"),
                ),
                KEYSPACE_FLAG,
                *CLIENT_FLAGS,
            ),
        ),
        Command(
            "alter",
            "change a subscription's settings",
            "Change the settings of subscription NAME of TABLE: the options given replace "
            "their values, the others stay. --filter '' and --columns '' clear them; 0 sets "
            "--ack-wait back to the table's and removes --max-lag and --expire-after (a change "
            "of --expire-after makes an expired subscription active again). A new filter "
            "applies to the messages handed over from then on: those already in the "
            f"subscription's queue stay. {WHERE_THEY_LIVE}",
            (
                SUBSCRIPTION_TABLE,
                SUBSCRIPTION_NAME,
                *_settings_flags(alter=True),
                KEYSPACE_FLAG,
                *CLIENT_FLAGS,
            ),
        ),
        Command(
            "drop",
            "drop a subscription and its delivery state",
            "Drop subscription NAME of TABLE: its definition and its state table TABLE__NAME, "
            "with the messages it has not settled and its dead ones; this cannot be undone. "
            "Its subscribers end (NOT_FOUND), and it no longer holds the table's purge. "
            f"{WHERE_THEY_LIVE}",
            (SUBSCRIPTION_TABLE, SUBSCRIPTION_NAME, KEYSPACE_FLAG, *CLIENT_FLAGS),
        ),
        Command(
            "list",
            "list subscriptions with their lag and state",
            "List the subscriptions of TABLE (or of every table): state (active, or expired: "
            "no subscriber for its --expire-after), subscribers, lag (messages handed to it "
            "and not settled, counted up to 1,000,000), the age of the oldest of them, whether "
            "it holds the table's purge (and if not, why), and filter.",
            (
                Flag("table", "only this table's", default="", optional=True, metavar="TABLE"),
                Flag(
                    "--json",
                    "one JSON object per line (ages in seconds, times in unix nanoseconds)",
                    store_true=True,
                ),
                KEYSPACE_FLAG,
                *CLIENT_FLAGS,
            ),
        ),
    ),
)

# -- push endpoints ------------------------------------------------------------------------------
ENDPOINT_SUBSCRIPTION = Flag(
    "--subscription",
    "the endpoint of this subscription of TABLE (default the table's default group)",
    default="",
)
ENDPOINT = Command(
    "endpoint",
    "set, drop and list push endpoints",
    "A push endpoint delivers a table's default group (or one of its subscriptions) by HTTP "
    "POST instead of to msgtable tail / MessageStream subscribers: CloudEvents in batches, "
    "signed the Standard Webhooks way; a 2xx answer acks the batch (docs/how-to/push.md). "
    "The definitions live in the database (table msgtable_endpoints), so every "
    "server sees them; the one holding the lease pushes. The server calls only URLs its "
    "--push-allow allows.",
    subcommands=(
        Command(
            "set",
            "push a table or subscription to a URL",
            "Push TABLE's default group (or --subscription's) to URL, replacing its endpoint "
            "if it has one. The signing secret comes from --secret-file or MSGTABLE_PUSH_SECRET "
            "(whsec_<base64>, or 16-512 bytes of text); it is never shown again. A URL outside "
            "the server's --push-allow is stored and waits (msgtable tables says why).",
            (
                Flag("table", "message table"),
                Flag("url", "http(s)://host[:port]/path"),
                ENDPOINT_SUBSCRIPTION,
                Flag(
                    "--secret-file",
                    "a file holding the signing secret (surrounding white space is dropped)",
                    metavar="FILE",
                ),
                Flag(
                    "--max-in-flight",
                    "batches POSTed at once (default 4)",
                    default=0,
                    type=positive_int,
                    metavar="N",
                ),
                Flag(
                    "--timeout",
                    "the time-out of one POST: 10, 30s, 2m (default 10s)",
                    default=0.0,
                    type=duration,
                    metavar="S",
                ),
                KEYSPACE_FLAG,
                *CLIENT_FLAGS,
            ),
        ),
        Command(
            "drop",
            "stop pushing a table or subscription",
            "Drop the endpoint of TABLE's default group (or --subscription's): its messages "
            "wait for subscribers again.",
            (Flag("table", "message table"), ENDPOINT_SUBSCRIPTION, KEYSPACE_FLAG, *CLIENT_FLAGS),
        ),
        Command(
            "list",
            "list push endpoints with their state",
            "List every push endpoint the server has: table, subscription, URL (never the "
            "secret), state (pushing; idle: another server pushes; not allowed: why; failing: "
            "the last error), batches in flight, messages pushed and failed.",
            CLIENT_FLAGS,
        ),
    ),
)

# -- schedules -----------------------------------------------------------------------------------
SCHEDULES_LIVE = (
    "Schedules live in the database (table msgtable_schedules, created with the first one), "
    "so every msgtable server of it sees them; the one that holds their placement unit "
    "enqueues each tick, once: the message and the schedule's next tick in one transaction."
)
SCHEDULE = Command(
    "schedule",
    "create, list and drop schedules (recurring messages)",
    "A schedule enqueues one message into a message table at each tick of a cron expression, "
    f"exactly once across the servers of the database. {SCHEDULES_LIVE}",
    subcommands=(
        Command(
            "create",
            "create a schedule",
            "Create schedule NAME: at each tick of CRON (croniter's: minute hour day-of-month "
            "month day-of-week, a sixth field for seconds, a seventh for the year, or @hourly "
            "and the like) in --timezone, one message of --values goes into TABLE (its id a "
            "hash of the schedule and the tick; a schedule_tick column, where the table has "
            "one, gets the tick). A bad expression is refused naming the field by its "
            "position, and nothing is written. The first tick is the first time of CRON from "
            f"now. {SCHEDULES_LIVE}",
            (
                Flag("name", "the schedule: 1-64 letters, digits, '_', '-' or '.'"),
                Flag("table", "message table"),
                Flag("cron", "the cron expression, quoted: '*/5 * * * *'", metavar="CRON"),
                Flag(
                    "--values",
                    'the message\'s column values, a JSON object: \'{"message": "rebuild"}\' '
                    "(default none: the table's defaults)",
                    default="{}",
                    metavar="JSON",
                ),
                Flag(
                    "--timezone",
                    "the IANA time zone CRON is read in, DST included (default UTC)",
                    default="UTC",
                    metavar="TZ",
                ),
                Flag(
                    "--missed",
                    "ticks missed while no server ran: skip them, or enqueue one message for "
                    "them all once a server runs again; a tick up to 2 minutes late (a "
                    "hand-over, a restart) is enqueued either way (default skip)",
                    default="skip",
                    choices=("skip", "once"),
                ),
                KEYSPACE_FLAG,
                *CLIENT_FLAGS,
            ),
        ),
        Command(
            "list",
            "list schedules with their last and next tick",
            "List the schedules (of TABLE, or all): table, cron expression and time zone, "
            "what becomes of missed ticks, the last tick enqueued and the next one, and how "
            "many messages it has enqueued.",
            (
                Flag("table", "only this table's", default="", optional=True, metavar="TABLE"),
                Flag(
                    "--json",
                    "one JSON object per line (times in unix nanoseconds)",
                    store_true=True,
                ),
                KEYSPACE_FLAG,
                *CLIENT_FLAGS,
            ),
        ),
        Command(
            "drop",
            "drop a schedule",
            "Drop schedule NAME: no tick of it is enqueued after (the messages it enqueued "
            "stay in their table).",
            (Flag("name", "the schedule"), KEYSPACE_FLAG, *CLIENT_FLAGS),
        ),
    ),
)

COMMANDS = (
    SERVE,
    GATEWAY,
    TABLES,
    TAIL,
    SUBSCRIPTION,
    ENDPOINT,
    SCHEDULE,
    DEAD,
    REDRIVE,
    ARCHIVE,
    REPORT,
)
# Every command's: all of the logs (libraries' too), and an error's details.
VERBOSE = Flag("--verbose", "log everything, and show an error's details", store_true=True)


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, with defaults from ``environ`` (the process's)."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="msgtable",
        description="A message-table engine for MySQL: enqueue with SQL, stream over gRPC.",
    )
    parser.add_argument("--version", action="version", version=f"msgtable {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        _add_command(sub, command, env)
    return parser


def _add_command(sub: Any, command: Command, env: Mapping[str, str]) -> None:
    p = sub.add_parser(command.name, help=command.help, description=command.description)
    if command.subcommands:
        inner = p.add_subparsers(dest="action", required=True, metavar="ACTION")
        for child in command.subcommands:
            _add_command(inner, child, env)
        return
    for flag in (*command.flags, VERBOSE):
        flag.add_to(p, env)
