"""A keyspace of two shards from the command line: `msgtable serve --keyspace-file F --shard
NAME` for each shard's database, `msgtable gateway --keyspace-file F` in front of them, and
`msgtable tables` / `msgtable tail --ack` through the gateway, as a user runs them; a
misdescribed keyspace or a wrong flag is one line naming the cause."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from msgtable.core.keyspace import load
from msgtable.core.tables import current_layout_ddl
from msgtable.testing.devdb import free_port
from tests.integration.helpers import comment

from .helpers import MSGTABLE, Cli, Serve, assert_one_line_error, wait_until

pytestmark = pytest.mark.timeout(180)

RANGES = ("-80", "80-")


@pytest.fixture
def shards(mysql_server, db_name: str) -> Iterator[dict[str, str]]:
    """Two databases, each with message table q: their DSNs by shard name."""
    dsns = {}
    for k, rng in enumerate(RANGES):
        name = f"{db_name}_{k}"
        mysql_server.drop_database(name)
        mysql_server.create_database(name)
        dsns[rng] = mysql_server.dsn(name)
        db = sa.create_engine(dsns[rng], isolation_level="AUTOCOMMIT")
        with db.connect() as conn:
            conn.execute(sa.text(current_layout_ddl("q", comment(vt_poller_interval=0.2))))
        db.dispose()
    yield dsns
    for k in range(len(RANGES)):
        mysql_server.drop_database(f"{db_name}_{k}")


def keyspace_file(path: Path, dsns: dict[str, str], servers: dict[str, str]) -> Path:
    text = 'name = "app"\n'
    for rng, dsn in dsns.items():
        text += f'[[shards]]\nkey_range = "{rng}"\ndsn = "{dsn}"\nservers = ["{servers[rng]}"]\n'
    path.write_text(text)
    return path


def serve_shard(cli: Cli, file: Path, shard: str, address: str) -> Serve:
    argv = [*MSGTABLE, "serve", "--keyspace-file", str(file), "--shard", shard]
    serve = Serve(address, [*argv, "--listen", address], cli.env(), cli.log_dir, f"serve{shard}")
    cli.processes.append(serve)
    serve.wait_answering()
    return serve


def test_a_keyspace_served_by_shard_and_read_through_one_gateway(
    cli: Cli, shards: dict[str, str], tmp_path: Path
):
    servers = {rng: f"127.0.0.1:{free_port()}" for rng in RANGES}
    file = keyspace_file(tmp_path / "keyspace.toml", shards, servers)
    for rng in RANGES:
        serve = serve_shard(cli, file, rng, servers[rng])
        serve.wait_for_output(rf"shard {rng} of keyspace 'app'")
    gateway_address = f"127.0.0.1:{free_port()}"
    metrics_address = f"127.0.0.1:{free_port()}"
    gateway = cli.start(
        "gateway",
        "--keyspace-file",
        str(file),
        "--listen",
        gateway_address,
        "--metrics-listen",
        metrics_address,
    )
    gateway.wait_for_output(r"gateway of keyspace 'app' \(shards -80, 80-; tables q\) on ")
    gateway.wait_for_output(rf"metrics on http://{metrics_address}/metrics")

    tables = cli.run("tables", "--server", gateway_address)
    assert tables.returncode == 0, tables.stderr
    assert [line.split()[:2] for line in tables.stdout.splitlines()[1:3]] == [
        ["q", "app/-80"],
        ["q", "app/80-"],
    ]

    ks = load(file)
    ids = list(range(1, 61))
    by_shard: dict[str, list[int]] = {rng: [] for rng in RANGES}
    for shard, i in zip(ks.shards_of(ids), ids, strict=True):
        by_shard[shard.name].append(i)
    for rng, shard_ids in by_shard.items():
        db = sa.create_engine(shards[rng], isolation_level="AUTOCOMMIT")
        with db.connect() as conn:
            conn.execute(
                sa.text("INSERT INTO q (id, message) VALUES (:id, :m)"),
                [{"id": i, "m": f"m{i}"} for i in shard_ids],
            )
        db.dispose()
    tail = cli.start("tail", "q", "--ack", "--json", "--count", "60", "--server", gateway_address)
    assert tail.wait(60) == 0, tail.describe()
    got = sorted(json.loads(line)["id"] for line in tail.stdout.splitlines())
    assert got == ids

    def acked() -> dict[str, list[int]] | None:
        out = {}
        for rng in RANGES:
            db = sa.create_engine(shards[rng])
            with db.connect() as conn:
                out[rng] = sorted(
                    r[0] for r in conn.execute(sa.text("SELECT id FROM q WHERE time_acked > 0"))
                )
            db.dispose()
        return out if out == by_shard else None

    wait_until(acked, 20, "each shard's messages acked in that shard")

    scraped = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10).read()
    relayed = {
        s.labels["shard"]: s.value
        for f in text_string_to_metric_families(scraped.decode())
        for s in f.samples
        if s.name == "msgtable_gateway_messages_relayed_total"
    }
    assert relayed == {rng: len(by_shard[rng]) for rng in RANGES}


def test_a_misdescribed_keyspace_or_a_wrong_flag_is_one_line(
    cli: Cli, shards: dict[str, str], tmp_path: Path
):
    servers = {rng: f"127.0.0.1:{free_port()}" for rng in RANGES}
    file = keyspace_file(tmp_path / "keyspace.toml", shards, servers)
    done = cli.run("serve", "--keyspace-file", str(file), "--listen", "127.0.0.1:0")
    assert_one_line_error(done, "--keyspace-file needs --shard")
    done = cli.run("serve", "--shard", "-80", "--listen", "127.0.0.1:0")
    assert_one_line_error(done, "--shard needs --keyspace-file")
    done = cli.run("serve", "--keyspace-file", str(file), "--shard", "-80", "--dsn", shards["-80"])
    assert_one_line_error(done, "give --dsn or --keyspace-file with --shard, not both")
    done = cli.run("serve", "--keyspace-file", str(file), "--shard", "-40")
    assert_one_line_error(done, "keyspace 'app' has no shard '-40' (its shards: -80, 80-)")
    gap = tmp_path / "gap.toml"
    gap.write_text(
        file.read_text().replace('key_range = "80-"', 'key_range = "c0-"'), encoding="utf-8"
    )
    done = cli.run("gateway", "--keyspace-file", str(gap))
    assert_one_line_error(done, "a gap after shard -80")
    serve_shard(cli, file, "-80", servers["-80"])  # shard 80- has no server running
    done = cli.run("gateway", "--keyspace-file", str(file), "--timeout", "2")
    assert_one_line_error(done, "shard 80- of keyspace 'app'")
    done = cli.run("gateway")
    assert_one_line_error(done, "--keyspace-file")
