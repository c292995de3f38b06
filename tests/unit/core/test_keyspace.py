"""Keyspaces of shards, the pure part: Vitess's hash vindex, key ranges in Vitess's notation,
a keyspace file's shards covering the keyspace, and which shard holds an id."""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgtable.core.keyspace import (
    MAX_ID,
    KeyRange,
    Keyspace,
    Shard,
    key_keyspace_id,
    keyspace_id,
    keyspace_ids,
    load,
)
from msgtable.errors import InvalidArgument

# Vitess's hash vindex of the ids 1 to 6 (its documentation's and tests' values)
VITESS_HASH = {
    1: "166b40b44aba4bd6",
    2: "06e7ea22ce92708f",
    3: "4eb190c9a2fa169c",
    4: "d2fd8867d50d2dfe",
    5: "70bb023c810ca87a",
    6: "f098480ac4c4be71",
}


def keyspace(*ranges: str) -> Keyspace:
    return Keyspace("app", tuple(Shard(KeyRange.parse(r), f"dsn {r}") for r in ranges))


def test_the_keyspace_id_is_vitess_s_hash_vindex():
    assert {i: keyspace_id(i).hex() for i in VITESS_HASH} == VITESS_HASH
    rng = random.Random(7)
    ids = sorted({0, MAX_ID, *(rng.randrange(MAX_ID + 1) for _ in range(500))})
    assert keyspace_ids(ids) == [keyspace_id(i) for i in ids]
    assert len(set(keyspace_ids(ids))) == len(ids)  # a bijection
    assert keyspace_ids([]) == []


@pytest.mark.parametrize("bad", [-1, MAX_ID + 1])
def test_an_id_without_a_keyspace_id_is_refused_by_name(bad: int):
    with pytest.raises(InvalidArgument, match=f"id {bad} has no keyspace id"):
        keyspace_ids([5, bad])


@pytest.mark.parametrize(
    "text, start, end, name",
    [
        ("-80", "", "80", "-80"),
        ("80-", "80", "", "80-"),
        ("40-80", "40", "80", "40-80"),
        ("00-80", "", "80", "-80"),  # 00 is the start
        ("8000-c000", "80", "c0", "80-c0"),  # trailing zero bytes change nothing
        ("-", "", "", "-"),
        ("", "", "", "-"),
        ("0", "", "", "-"),  # Vitess's name of an unsharded keyspace's shard
    ],
)
def test_key_ranges_in_vitess_notation(text: str, start: str, end: str, name: str):
    r = KeyRange.parse(text)
    assert (r.start.hex(), r.end.hex()) == (start, end)
    assert str(r) == name
    assert KeyRange.parse(str(r)) == r


@pytest.mark.parametrize(
    "text, why",
    [
        ("80", "is not START-END"),
        ("-80-c0", "is not START-END"),
        ("xy-", "'xy' is not hexadecimal"),
        ("8-", "'8' is not hexadecimal bytes"),
        ("80-40", "is empty"),
        ("80-80", "is empty"),
    ],
)
def test_a_bad_key_range_says_what_is_wrong(text: str, why: str):
    with pytest.raises(InvalidArgument, match=why):
        KeyRange.parse(text)


def test_a_key_range_holds_its_start_and_not_its_end():
    r = KeyRange.parse("40-80")
    assert r.contains(bytes.fromhex("4000000000000000"))
    assert r.contains(bytes.fromhex("7fffffffffffffff"))
    assert not r.contains(bytes.fromhex("8000000000000000"))
    assert not r.contains(bytes.fromhex("3fffffffffffffff"))
    assert KeyRange.parse("-").contains(bytes(8))


def test_each_id_lives_in_the_one_shard_whose_range_holds_its_keyspace_id():
    ks = keyspace("-40", "40-80", "80-c0", "c0-")
    ids = list(range(1, 20_001))
    shards = ks.shards_of(ids)
    for i, s in zip(ids[:2000], shards, strict=False):
        assert s.key_range.contains(keyspace_id(i))
        assert ks.shard_of(i) is s
    # sequential ids spread evenly: each shard a quarter, give or take 2 %
    spread = Counter(s.name for s in shards)
    assert set(spread) == {"-40", "40-80", "80-c0", "c0-"}
    assert all(0.23 <= n / len(ids) <= 0.27 for n in spread.values()), spread
    assert ks.shard_of(1).name == "-40"  # 166b... is below 40
    assert ks.shard_of(4).name == "c0-"  # d2fd...


@pytest.mark.parametrize(
    "ranges, why",
    [
        (("-40", "80-"), "a gap after shard -40: shard 80- starts at 80"),
        (("-80", "40-"), "an overlap after shard -80: shard 40- starts at 40"),
        (("80-",), "a gap at the start: shard 80- starts at 80"),
        (("-80",), "a gap at the end: the last shard -80 ends at 80"),
        (("-", "-80"), "shard - runs to the end, and shard -80 overlaps it"),
    ],
)
def test_shards_that_do_not_cover_the_keyspace_are_named(ranges: tuple[str, ...], why: str):
    with pytest.raises(InvalidArgument, match=why):
        keyspace(*ranges)


def test_a_stream_of_a_key_range_reads_the_whole_shards_inside_it():
    ks = keyspace("-40", "40-80", "80-")
    assert [s.name for s in ks.within(KeyRange.parse("-80"))] == ["-40", "40-80"]
    assert [s.name for s in ks.within(KeyRange.parse("-"))] == ["-40", "40-80", "80-"]
    assert [s.name for s in ks.within(KeyRange.parse("80-"))] == ["80-"]
    with pytest.raises(InvalidArgument, match="key range -60 cuts shard 40-80"):
        ks.within(KeyRange.parse("-60"))
    assert ks.shard("8000-").name == "80-"
    with pytest.raises(
        InvalidArgument, match=r"has no shard '-c0' \(its shards: -40, 40-80, 80-\)"
    ):
        ks.shard("-c0")


def test_a_keyspace_file(tmp_path: Path):
    path = tmp_path / "keyspace.toml"
    path.write_text(
        'name = "app"\n'
        '[[shards]]\nkey_range = "80-"\ndsn = "mysql+pymysql://u:p@db2/app"\n'
        '[[shards]]\nkey_range = "-80"\ndsn = "mysql+pymysql://u:p@db1/app"\n'
    )
    ks = load(path)
    assert ks.name == "app"
    assert [(s.name, s.dsn) for s in ks.shards] == [
        ("-80", "mysql+pymysql://u:p@db1/app"),
        ("80-", "mysql+pymysql://u:p@db2/app"),
    ]
    assert [s.servers for s in ks.shards] == [(), ()]


def test_a_keyspace_file_names_each_shard_s_servers(tmp_path: Path):
    path = tmp_path / "keyspace.toml"
    path.write_text(
        'name = "app"\n'
        '[[shards]]\nkey_range = "-80"\ndsn = "mysql+pymysql://u:p@db1/app"\n'
        'servers = ["10.0.0.1:50051", "10.0.0.2:50051"]\n'
        '[[shards]]\nkey_range = "80-"\ndsn = "mysql+pymysql://u:p@db2/app"\n'
        'servers = ["10.0.0.3:50051"]\n'
    )
    ks = load(path)
    assert [s.servers for s in ks.shards] == [
        ("10.0.0.1:50051", "10.0.0.2:50051"),
        ("10.0.0.3:50051",),
    ]
    assert ks.servers() == ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]


@pytest.mark.parametrize(
    "text, why",
    [
        ('name = "app"\n[[shards]]\nkey_range = "-80"\n', "shard -80 has no dsn"),
        ('name = "app"\n[[shards]]\ndsn = "x"\n', "shard 1 has no key_range"),
        ('[[shards]]\nkey_range = "-"\ndsn = "x"\n', 'name = "KEYSPACE" is missing'),
        ('name = "app"\n', r"no \[\[shards\]\]"),
        ('name = "app"\nshard = 1\n', "unknown key 'shard'"),
        (
            'name = "app"\n[[shards]]\nkey_range = "-"\ndsn = "x"\nhost = "y"\n',
            "unknown key 'host'",
        ),
        ('name = "app"\n[[shards]]\nkey_range = "-8"\ndsn = "x"\n', "shard 1: key range '-8'"),
        (  # a shard is named by its key range where it has one (issue 39)
            'name = "app"\n[[shards]]\nkey_range = "-80"\ndsn = "x"\n'
            '[[shards]]\nkey_range = "80-"\ndsn = "y"\nweight = 2\n',
            "shard 80-: unknown key 'weight'",
        ),
        (  # ... and by its place in the file where it has none that can be read
            'name = "app"\n[[shards]]\nkey_range = 7\ndsn = "x"\nweight = 2\n',
            "shard 1: unknown key 'weight'",
        ),
        (
            'name = "app"\n[[shards]]\nkey_range = "-"\ndsn = "x"\nservers = 3\n',
            r"keyspace.toml: shard - servers must be a list",
        ),
        (
            'name = "app"\n[[shards]]\nkey_range = "-80"\ndsn = "x"\n'
            '[[shards]]\nkey_range = "c0-"\ndsn = "y"\n',
            "keyspace 'app': a gap after shard -80",
        ),
        ("name = ", "is not valid TOML"),
        (
            'name = "app"\n[[shards]]\nkey_range = "-"\ndsn = "x"\nservers = "a:1"\n',
            r"shard - servers must be a list of HOST:PORT",
        ),
        (
            'name = "app"\n[[shards]]\nkey_range = "-"\ndsn = "x"\nservers = ["a"]\n',
            r"shard -: server 'a' is not HOST:PORT",
        ),
        (
            'name = "app"\n[[shards]]\nkey_range = "-80"\ndsn = "x"\nservers = ["a:1"]\n'
            '[[shards]]\nkey_range = "80-"\ndsn = "y"\nservers = ["a:1"]\n',
            r"server a:1 is named by shards -80 and 80-",
        ),
    ],
)
def test_a_misdescribed_keyspace_file_is_one_clear_line(tmp_path: Path, text: str, why: str):
    path = tmp_path / "keyspace.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgument, match=why) as raised:
        load(path)
    assert str(path) in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_unreadable_keyspace_file_is_named(tmp_path: Path):
    with pytest.raises(InvalidArgument, match=r"cannot read the keyspace file .*missing\.toml"):
        load(tmp_path / "missing.toml")


_TOML_PIECES = st.sampled_from(
    [
        'name = "app"\n',
        "name = 7\n",
        "[[shards]]\n",
        '[[shards]]\nkey_range = "-80"\ndsn = "d1"\n',
        '[[shards]]\nkey_range = "80-"\ndsn = "d2"\nservers = ["h:1"]\n',
        'key_range = "zz"\n',
        'key_range = "' + "ab" * 5_000 + '-"\n',
        "servers = [1, 2]\n",
        'servers = ["h:1", "h:1"]\n',
        'dsn = ""\n',
        "shards = 3\n",
        "[shards]\n",
        '"\\u0000" = 1\n',
        "= broken\n",
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(_TOML_PIECES, st.text(max_size=30)), max_size=8))
def test_a_hostile_keyspace_file_loads_or_is_one_line_naming_it(tmp_path_factory, pieces):
    path = tmp_path_factory.mktemp("ks") / "keyspace.toml"
    path.write_text("".join(pieces), encoding="utf-8")
    try:
        ks = load(path)
    except InvalidArgument as exc:
        assert str(path) in str(exc)
        assert "\n" not in str(exc).strip()
    else:
        assert ks.shards and ks.name  # what loads covers the keyspace (check_cover ran)


def test_an_order_key_s_keyspace_id_is_vitess_s_binary_md5_and_names_its_shard():
    ks = Keyspace(
        "app", tuple(Shard(KeyRange.parse(r), "d") for r in ("-40", "40-80", "80-c0", "c0-"))
    )
    assert key_keyspace_id("customer-42") == hashlib.md5(b"customer-42").digest()
    assert key_keyspace_id(42) == key_keyspace_id("42")
    assert key_keyspace_id(b"\xff") == hashlib.md5(b"\xff").digest()
    home = ks.shard_of_key("customer-42")
    assert home.key_range.contains(key_keyspace_id("customer-42"))
    with pytest.raises(InvalidArgument, match="an order key is text, bytes or an integer"):
        ks.shard_of_key(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["a", "customer-42", 7, b"\x00"])
def test_id_for_gives_the_smallest_id_from_a_start_that_lives_in_the_key_s_shard(key):
    ks = Keyspace(
        "app", tuple(Shard(KeyRange.parse(r), "d") for r in ("-40", "40-80", "80-c0", "c0-"))
    )
    home = ks.shard_of_key(key)
    for start in (0, 1, 1000, 2**63):
        got = ks.id_for(key, start)
        assert got >= start and ks.shard_of(got) is home
        assert all(ks.shard_of(i) is not home for i in range(start, got))
    ids, at = [], 1
    for _ in range(20):  # ascending ids of one key, all in its shard
        at = ks.id_for(key, at) + 1
        ids.append(at - 1)
    assert ids == sorted(ids) and {ks.shard_of(i).name for i in ids} == {home.name}
