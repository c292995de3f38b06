"""The client-side commands: ``msgtable tables``, ``tail``, ``subscription create / alter /
drop / list``, ``dead`` and ``redrive`` (over gRPC), and the Spark pipeline's ``msgtable
archive`` and ``msgtable report`` (the spark extra)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, TextIO

from msgtable.cli.flags import LIMIT_FLAGS
from msgtable.cli.output import (
    format_dead,
    format_endpoints,
    format_message,
    format_sqs,
    format_subscriptions,
    format_tables,
    subscription_json,
    table_json,
)
from msgtable.client import Client
from msgtable.core.words import counted
from msgtable.errors import InvalidArgument
from msgtable.limits import MAX_IN_FLIGHT, MAX_REDRIVE_BATCH

EXIT_OK = 0


def _client(args: argparse.Namespace) -> Client:
    # one call: a server that cannot be connected to fails it at once (msgtable.cli says
    # which flag names the address), not after the client's time-out of retries
    return Client(args.server, token=args.token, tls_ca=args.tls_ca, wait_for_server=False)


def tables(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with _client(args) as client:
        status = client.status()
    if args.json:  # a line per table, nothing else on stdout: the database's trouble on stderr
        for t in status.tables:
            print(table_json(t), file=out)
        if status.database_error:
            print(f"msgtable: database: {status.database_error}", file=sys.stderr)
        return EXIT_OK
    print(format_tables(status.tables, wide=args.wide), file=out)
    if status.sqs_listen or status.sqs_calls:  # calls without an address: a gateway's sum
        print(format_sqs(status.sqs_listen, status.sqs_calls), file=out)
    if status.database_error:
        print(f"database: {status.database_error}", file=out)
    return EXIT_OK


def tail(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    seen = 0
    try:
        # With --count N the stream asks for N messages in all (and a window of N): the
        # server sends no more than tail will show, so none is left in flight unseen when it
        # exits, even though its acks give the window room before its stream ends.
        window = min(args.count, MAX_IN_FLIGHT) if args.count is not None else 0
        with (
            _client(args) as client,
            client.subscribe(
                args.name,
                args.keyspace,
                max_in_flight=window,
                max_messages=args.count or 0,
                retry=False,  # a server that stops, a database away: tail ends, in one line
                follow=True,  # ... but it goes where the servers send the table
                subscription=args.subscription,
                columns=args.columns or (),
            ) as sub,
        ):
            for batch in sub.batches():
                if args.count is not None:
                    batch = batch[: args.count - seen]
                for message in batch:
                    print(format_message(message, sub.fields, args.json, args.time), file=out)
                out.flush()
                if args.ack:
                    sub.ack(batch)
                seen += len(batch)
                if args.count is not None and seen >= args.count:
                    break
    except KeyboardInterrupt:
        pass  # Ctrl-C is how tail ends
    return EXIT_OK


# -- subscriptions ---------------------------------------------------------------------------
# The settings as create and alter take them: the client's keyword, the flag's attribute.
SETTINGS = (
    ("filter", "filter"),
    ("columns", "columns"),
    ("ack_wait_s", "ack_wait"),
    ("max_attempts", "max_attempts"),
    ("max_lag", "max_lag"),
    ("expire_after_s", "expire_after"),
)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (a flag left out is not a change)."""
    given = {key: getattr(args, attr) for key, attr in SETTINGS}
    out = {key: value for key, value in given.items() if value is not None}
    limits = {n: getattr(args, n) for n, _, _ in LIMIT_FLAGS if getattr(args, n) is not None}
    if limits:
        out["limits"] = limits
    return out


def subscription_create(args: argparse.Namespace, out: TextIO | None = None) -> int:
    settings = _settings(args)
    if args.state_rows:
        settings["state_rows"] = args.state_rows
    with _client(args) as client:
        n = client.create_subscription(
            args.table, args.name, from_start=args.from_start, keyspace=args.keyspace, **settings
        )
    label = f"{args.table}/{args.name}"
    flt = settings.get("filter")
    what = f"messages matching {flt!r}" if flt else "every message"
    if args.from_start:
        handed = counted(n, "retained message")
        text = f"created subscription {label}: {handed} handed over, and {what}"
    else:
        text = f"created subscription {label}: {what}"
    text += " enqueued from now on"
    if args.state_rows == "lazy":
        text += " (state rows lazy: only for messages sent and not settled in order)"
    print(text, file=out or sys.stdout)
    return EXIT_OK


def subscription_alter(args: argparse.Namespace, out: TextIO | None = None) -> int:
    settings = _settings(args)
    if not settings:
        names = [attr for _, attr in SETTINGS] + [name for name, _, _ in LIMIT_FLAGS]
        flags = ", ".join("--" + attr.replace("_", "-") for attr in names)
        raise InvalidArgument(f"nothing to change: give one of {flags}")
    with _client(args) as client:
        client.alter_subscription(args.table, args.name, keyspace=args.keyspace, **settings)
    changes = ", ".join(_change(key, value) for key, value in settings.items())
    print(f"altered subscription {args.table}/{args.name}: {changes}", file=out or sys.stdout)
    return EXIT_OK


def _change(key: str, value: object) -> str:
    """One change as alter reports it."""
    word = key.removesuffix("_s").replace("_", " ")
    if key == "filter":
        if not value:
            return "filter cleared (every message from now on)"
        return f"filter {value!r} (for the messages handed over from now on)"
    if key == "columns":
        return f"columns {','.join(value)}" if isinstance(value, tuple) and value else "all columns"
    if key == "limits" and isinstance(value, dict):
        table = "the table's"
        return ", ".join(f"{k.replace('_', ' ')} {v or table}" for k, v in value.items())
    if value == 0:
        return {
            "ack_wait_s": "ack wait: the table's",
            "max_attempts": "max attempts: no limit",
            "max_lag": "max lag: no limit",
            "expire_after_s": "expire after: never",
        }[key]
    return f"{word} {value:g}s" if key.endswith("_s") else f"{word} {value}"


def subscription_drop(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from msgtable.core.subscriptions import state_table_name  # (the filter language: lazily)

    state = state_table_name(args.table, args.name)
    with _client(args) as client:
        client.drop_subscription(args.table, args.name, keyspace=args.keyspace)
    print(
        f"dropped subscription {args.table}/{args.name} and its state table {state}",
        file=out or sys.stdout,
    )
    return EXIT_OK


def subscription_list(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    with _client(args) as client:
        subs = client.list_subscriptions(args.table, keyspace=args.keyspace)
    if args.json:
        for s in subs:
            print(subscription_json(s), file=out)
    else:
        print(format_subscriptions(subs, args.table), file=out)
    return EXIT_OK


# -- push endpoints ------------------------------------------------------------------------------
def _secret(args: argparse.Namespace) -> str:
    if args.secret_file:
        try:
            with open(args.secret_file, encoding="utf-8") as f:
                return f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument(
                f"cannot read --secret-file {args.secret_file}: {exc.__class__.__name__}"
            ) from None
    secret = os.environ.get("MSGTABLE_PUSH_SECRET", "")
    if not secret:
        raise InvalidArgument(
            "an endpoint needs a secret: --secret-file FILE or MSGTABLE_PUSH_SECRET"
        )
    return secret


def endpoint_set(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        client.set_endpoint(
            args.table,
            args.url,
            _secret(args),
            subscription=args.subscription,
            max_in_flight=args.max_in_flight,
            timeout_s=args.timeout,
            keyspace=args.keyspace,
        )
    label = f"{args.table}/{args.subscription}" if args.subscription else args.table
    print(f"{label} is pushed to {args.url}", file=out or sys.stdout)
    return EXIT_OK


def endpoint_drop(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        client.drop_endpoint(args.table, args.subscription, keyspace=args.keyspace)
    label = f"{args.table}/{args.subscription}" if args.subscription else args.table
    print(f"{label} is no longer pushed", file=out or sys.stdout)
    return EXIT_OK


def endpoint_list(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        tables = client.list_tables()
    print(format_endpoints(tables), file=out or sys.stdout)
    return EXIT_OK


def dead(args: argparse.Namespace, out: TextIO | None = None) -> int:
    with _client(args) as client:
        rows, total = client.dead_letters(
            args.name, limit=args.limit, keyspace=args.keyspace, subscription=args.subscription
        )
    print(format_dead(rows, total, args.name), file=out or sys.stdout)
    return EXIT_OK


def _ids(text: str | None) -> list[object] | None:
    """--ids: integers where they are digits, else text (the server checks the type)."""
    if not text:
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    return [int(p) if p.lstrip("+-").isdigit() else p for p in parts]


def redrive(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Redrive batch by batch (one Redrive call, one transaction each), at most --rate a
    second; a bar on a terminal; the count at the end (also when interrupted)."""
    out = out or sys.stdout
    ids = _ids(args.ids)
    if args.batch > MAX_REDRIVE_BATCH:
        raise InvalidArgument(f"--batch must be at most {MAX_REDRIVE_BATCH:,}, not {args.batch}")
    moved, skipped = 0, list[object]()
    with _client(args) as client:
        sub = args.subscription
        _, total = client.dead_letters(args.name, limit=1, keyspace=args.keyspace, subscription=sub)
        goal = min(x for x in (total, args.limit, len(ids) if ids else None) if x is not None)
        started = time.monotonic()
        from tqdm import tqdm  # the progress bar: only redrive needs it

        bar = tqdm(
            total=goal,
            unit="msg",
            desc=f"redrive {args.name}",
            file=sys.stderr,
            disable=not sys.stderr.isatty(),
        )
        after = None
        try:
            while args.limit is None or moved < args.limit:
                n = args.batch if args.limit is None else min(args.batch, args.limit - moved)
                if args.rate:
                    n = max(1, min(n, int(args.rate)))
                batch = client.redrive(
                    args.name,
                    args.to,
                    ids,
                    limit=n,
                    after=after,
                    keyspace=args.keyspace,
                    subscription=sub,
                )
                if batch.last is None:
                    break
                moved += batch.moved
                skipped += batch.skipped
                after = batch.last
                bar.update(batch.moved)
                if args.rate:  # at most --rate a second, on average from the start
                    ahead = moved / args.rate - (time.monotonic() - started)
                    if ahead > 0:
                        time.sleep(ahead)
        except KeyboardInterrupt:
            bar.close()
            print(f"interrupted: moved {moved:,} so far; run it again to go on", file=out)
            raise
        bar.close()
    if args.subscription:
        print(
            f"moved {counted(moved, 'dead message')} of subscription "
            f"{args.name}/{args.subscription} back to it",
            file=out,
        )
    else:
        target = args.to or "their table"
        print(f"moved {counted(moved, 'dead letter')} of {args.name} to {target}", file=out)
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (" ..." if len(skipped) > 10 else "")
        print(
            f"skipped {len(skipped):,} whose id the table has again (left dead): {shown}",
            file=out,
        )
    return EXIT_OK


def archive(args: argparse.Namespace) -> int:
    from msgtable.spark.commands import archive_command

    return archive_command(args)


def report(args: argparse.Namespace) -> int:
    from msgtable.spark.commands import report_command

    return report_command(args)
