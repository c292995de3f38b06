"""Keyspaces of shards: which database holds a message, by its id (the pure part).

A keyspace is a set of MySQL / MariaDB databases, its shards, each an ordinary server with its
own replication and failover, holding the same message tables for one key range of the
keyspace. A message lives in the shard whose key range holds its id's keyspace id.

The keyspace id is Vitess's ``hash`` vindex of the id: the id as 8 bytes (unsigned 64-bit,
big-endian) encrypted with DES under an all-zero key. So id 1 is keyspace id
``166b40b44aba4bd6``, and a keyspace's rows can move to Vitess later (a ``hash`` primary vindex
on ``id``) and stay in their shards. An id must be 0 to 2**64 - 1 (Vitess refuses negative
ones too). The function is a bijection: ids spread evenly over the keyspace ids whatever their
pattern (sequential, snowflake-like).

Key ranges are in Vitess's notation: two hexadecimal bounds, the start included and the end
excluded, compared as byte strings (so ``80`` is the same bound as ``8000``); an empty bound
is open: ``-80`` is every keyspace id below 0x80..., ``80-`` the rest, ``-`` (or ``0``, or an
empty name, as Vitess names an unsharded keyspace's one shard) the whole keyspace. A
keyspace's shards cover the whole keyspace, with no gap and no overlap.

A keyspace is described in one TOML file that servers and clients read::

    name = "app"

    [[shards]]
    key_range = "-80"
    dsn = "mysql+pymysql://msgtable:secret@db1:3306/app"
    servers = ["10.0.0.1:50051", "10.0.0.2:50051"]

    [[shards]]
    key_range = "80-"
    dsn = "mysql+pymysql://msgtable:secret@db2:3306/app"
    servers = ["10.0.0.3:50051"]

A shard's name is its key range, as in Vitess. ``servers`` are the gRPC addresses of the
``msgtable serve --keyspace FILE --shard NAME`` processes of that shard (the gateway and the
Python client stream from them); enqueueing and Spark need only the DSNs.
"""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgtable.core import tomlfile
from msgtable.errors import InvalidArgument

MAX_ID = 2**64 - 1  # the largest id that has a keyspace id
KEYSPACE_ID_BYTES = 8
UNSHARDED = ("", "-", "0")  # names of the whole keyspace's one shard

_ID_PROBE = 64  # ids tried at once by Keyspace.id_for
_ZERO_KEY = bytes(24)  # DES under an all-zero key: triple DES with three equal keys is DES


def _des() -> Any:
    # cryptography keeps DES among its "decrepit" algorithms; it is a hash here, not a cipher
    from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES
    from cryptography.hazmat.primitives.ciphers import Cipher, modes

    return Cipher(TripleDES(_ZERO_KEY), modes.ECB())


def keyspace_ids(ids: Iterable[int]) -> list[bytes]:
    """Each id's keyspace id (Vitess's ``hash`` vindex, see the module docstring), in one
    pass: ECB encrypts each 8-byte block on its own. InvalidArgument for an id outside 0 to
    2**64 - 1."""
    ids = list(ids)
    for i in ids:
        if not 0 <= i <= MAX_ID:
            raise InvalidArgument(
                f"id {i} has no keyspace id: a sharded table's ids are 0 to {MAX_ID}"
            )
    if not ids:
        return []
    encryptor = _des().encryptor()
    data = encryptor.update(struct.pack(f">{len(ids)}Q", *ids)) + encryptor.finalize()
    return [data[k : k + KEYSPACE_ID_BYTES] for k in range(0, len(data), KEYSPACE_ID_BYTES)]


def keyspace_id(id_: int) -> bytes:
    """One id's keyspace id."""
    return keyspace_ids([id_])[0]


def key_keyspace_id(key: str | bytes | int) -> bytes:
    """The keyspace id of an ordered table's key (vt_order_key): Vitess's ``binary_md5``
    vindex of its bytes (text as UTF-8, an integer as its decimal digits). The shard whose
    range holds it is the key's: all its messages live there (Keyspace.id_for)."""
    if isinstance(key, bool) or not isinstance(key, str | bytes | int):
        raise InvalidArgument(f"an order key is text, bytes or an integer, not {key!r:.60}")
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8")
    return hashlib.md5(raw, usedforsecurity=False).digest()


@dataclass(frozen=True, order=True)
class KeyRange:
    """Keyspace ids from ``start`` (included) to ``end`` (excluded); b"" is open."""

    start: bytes = b""
    end: bytes = b""

    @classmethod
    def parse(cls, text: str) -> KeyRange:
        """A key range in Vitess's notation ("-80", "40-80", "80-", "-"); InvalidArgument
        naming what is wrong."""
        if text.strip() in UNSHARDED:
            return cls()
        start, sep, end = text.strip().partition("-")
        if not sep or "-" in end:
            raise InvalidArgument(
                f"key range {text!r} is not START-END in hexadecimal (e.g. -80, 40-80, 80-)"
            )
        bounds = []
        for bound in (start, end):
            try:
                raw = bytes.fromhex(bound) if len(bound) % 2 == 0 else None
            except ValueError:
                raw = None
            if raw is None:
                raise InvalidArgument(
                    f"key range {text!r}: {bound!r} is not hexadecimal bytes (two digits each)"
                )
            bounds.append(raw.rstrip(b"\0"))
        key_range = cls(bounds[0], bounds[1])
        if key_range.end and key_range.start >= key_range.end:
            raise InvalidArgument(f"key range {text!r} is empty: its start is not below its end")
        return key_range

    def __str__(self) -> str:
        if self.whole:
            return "-"
        return f"{self.start.hex()}-{self.end.hex()}"

    @property
    def whole(self) -> bool:
        return not self.start and not self.end

    def holds(self, other: KeyRange) -> bool:
        """Whether every keyspace id of ``other`` is in this range."""
        return self.start <= other.start and (
            not self.end or (bool(other.end) and other.end <= self.end)
        )

    def contains(self, kid: bytes) -> bool:
        """Whether keyspace id ``kid`` is in this range."""
        return self.start <= kid and (not self.end or kid < self.end)


@dataclass(frozen=True)
class Shard:
    """One database of a keyspace: its key range (also its name), where it is, and the
    addresses of the servers that send its tables."""

    key_range: KeyRange
    dsn: str
    servers: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return str(self.key_range)


@dataclass(frozen=True)
class Keyspace:
    """A keyspace's shards in key-range order, covering it whole (``check`` on creation)."""

    name: str
    shards: tuple[Shard, ...]

    def __post_init__(self) -> None:
        check_cover(self.name, self.shards)

    def servers(self) -> list[str]:
        """Every shard's servers, in shard order."""
        return [a for s in self.shards for a in s.servers]

    def shard_of_key(self, key: str | bytes | int) -> Shard:
        """The shard of an ordered table's key (key_keyspace_id): its messages' home."""
        return self._holding(key_keyspace_id(key))

    def id_for(self, key: str | bytes | int, at_least: int) -> int:
        """The smallest id from ``at_least`` on that lives in the shard of ``key``: give a
        key's messages such ids, ascending, and the key lives in one shard, its messages in
        id order there (about one id in as many as there are shards qualifies)."""
        home = self.shard_of_key(key)
        start = at_least
        while start <= MAX_ID:
            ids = list(range(start, min(start + _ID_PROBE, MAX_ID + 1)))
            for i, shard in zip(ids, self.shards_of(ids), strict=True):
                if shard is home:
                    return i
            start += _ID_PROBE
        raise InvalidArgument(f"no id from {at_least} to {MAX_ID} lives in shard {home.name}")

    def _holding(self, kid: bytes) -> Shard:
        starts = [s.key_range.start for s in self.shards]
        return self.shards[bisect.bisect_right(starts, kid) - 1]

    def shard_of(self, id_: int) -> Shard:
        """The shard that holds message ``id_``."""
        return self.shards_of([id_])[0]

    def shards_of(self, ids: Sequence[int]) -> list[Shard]:
        """The shard of each id, in one pass."""
        starts = [s.key_range.start for s in self.shards]
        return [self.shards[bisect.bisect_right(starts, k) - 1] for k in keyspace_ids(ids)]

    def shard(self, name: str) -> Shard:
        """The shard named ``name`` (its key range, in any equivalent notation)."""
        wanted = KeyRange.parse(name)
        for s in self.shards:
            if s.key_range == wanted:
                return s
        names = ", ".join(s.name for s in self.shards)
        raise InvalidArgument(f"keyspace {self.name!r} has no shard {name!r} (its shards: {names})")

    def within(self, key_range: KeyRange) -> list[Shard]:
        """The shards a stream of ``key_range`` reads: each one inside it. As in Vitess, the
        range must be a union of whole shards; InvalidArgument when it cuts one."""
        found = []
        for s in self.shards:
            r = s.key_range
            inside = key_range.start <= r.start and (
                not key_range.end or (bool(r.end) and r.end <= key_range.end)
            )
            outside = (bool(key_range.end) and r.start >= key_range.end) or (
                bool(r.end) and r.end <= key_range.start
            )
            if inside:
                found.append(s)
            elif not outside:
                raise InvalidArgument(
                    f"key range {key_range} cuts shard {s.name} of keyspace {self.name!r}: "
                    "ask for whole shards"
                )
        return found


def check_cover(name: str, shards: Sequence[Shard]) -> None:
    """InvalidArgument unless ``shards``, in key-range order, cover the whole keyspace with no
    gap and no overlap, naming the shard where it goes wrong."""
    if not shards:
        raise InvalidArgument(f"keyspace {name!r} has no shards")
    at = b""  # where the next shard must start
    for k, s in enumerate(shards):
        r = s.key_range
        if r.start != at:
            before = f"after shard {shards[k - 1].name}" if k else "at the start"
            what = "a gap" if r.start > at else "an overlap"
            raise InvalidArgument(
                f"keyspace {name!r}: {what} {before}: shard {s.name} starts at "
                f"{r.start.hex() or 'the start'}, where {at.hex() or 'the start'} was expected"
            )
        if not r.end:
            if k != len(shards) - 1:
                raise InvalidArgument(
                    f"keyspace {name!r}: shard {s.name} runs to the end, and shard "
                    f"{shards[k + 1].name} overlaps it"
                )
            return
        at = r.end
    raise InvalidArgument(
        f"keyspace {name!r}: a gap at the end: the last shard {shards[-1].name} ends at "
        f"{at.hex()}, and no shard runs to the end"
    )


def load(path: str | Path) -> Keyspace:
    """The keyspace a TOML file describes (see the module docstring); InvalidArgument with
    one line naming what is wrong."""
    return from_dict(tomlfile.read(path, "the keyspace file"), str(path))


def from_dict(doc: Mapping[str, Any], where: str = "the keyspace file") -> Keyspace:
    """The keyspace of a parsed keyspace file."""
    unknown = set(doc) - {"name", "shards"}
    if unknown:
        raise InvalidArgument(f"{where}: unknown key {sorted(unknown)[0]!r}")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f'{where}: name = "KEYSPACE" is missing')
    raw = doc.get("shards")
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument(f"{where}: no [[shards]] (each with key_range and dsn)")
    shards = []
    for k, entry in enumerate(raw, 1):
        if not isinstance(entry, dict):
            raise InvalidArgument(f"{where}: shard {k} is not a table")
        key_range, dsn = entry.get("key_range"), entry.get("dsn")
        # a shard is named by its key range, as the file gives it; by its place without one
        shard = f"shard {key_range.strip() or '-'}" if isinstance(key_range, str) else f"shard {k}"
        extra = set(entry) - {"key_range", "dsn", "servers"}
        if extra:
            raise InvalidArgument(f"{where}: {shard}: unknown key {sorted(extra)[0]!r}")
        if not isinstance(key_range, str):
            raise InvalidArgument(f'{where}: shard {k} has no key_range (e.g. "-80")')
        if not isinstance(dsn, str) or not dsn:
            raise InvalidArgument(f"{where}: shard {key_range} has no dsn")
        try:
            parsed = KeyRange.parse(key_range)
        except InvalidArgument as exc:  # its key range cannot be read: named by its place
            raise InvalidArgument(f"{where}: shard {k}: {exc}") from None
        try:
            shards.append(Shard(parsed, dsn, _servers(entry, key_range)))
        except InvalidArgument as exc:  # names the shard itself
            raise InvalidArgument(f"{where}: {exc}") from None
    named: dict[str, str] = {}
    for s in shards:
        for address in s.servers:
            if address in named:
                raise InvalidArgument(
                    f"{where}: server {address} is named by shards {named[address]} and "
                    f"{s.name}: a server sends one shard"
                )
            named[address] = s.name
    shards.sort(key=lambda s: s.key_range)
    try:
        return Keyspace(name, tuple(shards))
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}: {exc}") from None


def _servers(entry: Mapping[str, Any], key_range: str) -> tuple[str, ...]:
    """A shard entry's ``servers``: HOST:PORT strings."""
    raw = entry.get("servers", [])
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise InvalidArgument(
            f'shard {key_range} servers must be a list of HOST:PORT (e.g. ["db1:50051"])'
        )
    for address in raw:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgument(f"shard {key_range}: server {address!r} is not HOST:PORT")
    return tuple(raw)
