"""The SQS API's scenario, shared by the SDKs' tests (boto3 here, the AWS SDK for JavaScript
v3 through node): its tables, a server serving them with --sqs-listen, and the digests as
SQS computes them, written out here again so the server's are checked against an
independent copy."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from msgtable.core.tables import current_layout_ddl
from tests.integration.helpers import comment

from .helpers import Cli, Serve, free_port

if TYPE_CHECKING:
    from tests.conftest import Sql

REGION = "eu-test-1"  # any: msgtable has no regions
ACCESS_KEY = "AKIAMSGTABLETEST0001"
SECRET = "a-test-secret-of-some-length"
NOBODY_KEY = "AKIAMSGTABLENOBODY01"
NOBODY_SECRET = "another-secret-for-nobody"
AUTH_FILE = f"""
[access_keys]
"{ACCESS_KEY}" = {{ secret = "{SECRET}", principal = "worker" }}
"{NOBODY_KEY}" = {{ secret = "{NOBODY_SECRET}", principal = "nobody" }}

[[allow]]
principal = "worker"
tables = ["*"]
actions = ["send", "subscribe", "ack", "list"]
"""


def jobs_ddl(name: str, **fields: Any) -> str:
    """A message table with a body of up to 1 MB, a customer column (an attribute) and the
    JSON column other attributes go to."""
    ddl = current_layout_ddl(name, comment(vt_poller_interval=1, **fields))
    return ddl.replace(
        "  message varchar(128),",
        "  message mediumtext,\n  customer varchar(64),\n  message_attributes json,",
    )


def dead_ddl(name: str) -> str:
    return current_layout_ddl(name, comment(vt_poller_interval=1)).replace(
        "  message varchar(128),",
        "  message mediumtext,\n  customer varchar(64),\n  message_attributes json,\n"
        "  time_dead bigint not null,\n  attempts bigint not null,\n  last_error varchar(1000),",
    )


def events_ddl(name: str) -> str:
    """An ordered table (a FIFO queue): the group id in grp, deduplication by its column."""
    ddl = current_layout_ddl(name, comment(vt_poller_interval=1, vt_order_key="grp"))
    return ddl.replace(
        "  message varchar(128),",
        "  message mediumtext,\n  grp varchar(128),\n  message_deduplication_id varchar(128),\n"
        "  unique key dedup(message_deduplication_id),\n  index order_idx(grp, time_acked, id),",
    )


def create_tables(sql: Sql) -> None:
    sql.execute(dead_ddl("jobs_dead"))
    sql.execute(jobs_ddl("jobs", vt_max_attempts=3, vt_dead_letter="jobs_dead"))
    sql.execute(events_ddl("events"))


def serve_sqs(cli: Cli, db_dsn: str, *extra: str) -> tuple[Serve, str]:
    """msgtable serve with --sqs-listen on a free port; the server and the API's URL."""
    address = f"127.0.0.1:{free_port()}"
    serve = cli.serve("--dsn", db_dsn, "--sqs-listen", address, *extra)
    serve.wait_for_output(rf"^sqs on http://{address}$")
    return serve, f"http://{address}"


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """SQS's MD5OfMessageAttributes of attributes as boto3 sends them (bytes for binary)."""
    h = hashlib.md5()
    for name in sorted(attributes):
        a = attributes[name]
        for part in (name.encode(), a["DataType"].encode()):
            h.update(struct.pack(">I", len(part)) + part)
        if "BinaryValue" in a:
            value = bytes(a["BinaryValue"])
            h.update(b"\x02" + struct.pack(">I", len(value)) + value)
        else:
            value = a["StringValue"].encode()
            h.update(b"\x01" + struct.pack(">I", len(value)) + value)
    return h.hexdigest()
