"""A database whose authentication method needs a package PyMySQL lacks (MySQL 8's default,
caching_sha2_password, over TCP needs `cryptography`): PyMySQL raises a bare RuntimeError in
the handshake, and msgtable turns it into one line saying what to install, wherever it
connects (the store's pool, the lease, the binlog follower, Spark's connections).

The RuntimeError is PyMySQL's own, raised by its code with the package made missing."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pymysql
import pytest
import sqlalchemy as sa
from packaging.requirements import Requirement
from pymysql import _auth

from msgtable.engine.binlog import read_status
from msgtable.engine.lease import connector
from msgtable.engine.placement import Placement
from msgtable.errors import MsgtableError, Unavailable
from msgtable.spark.database import connection
from msgtable.store import dbpool
from msgtable.store.dbpool import ConnectionPool
from msgtable.store.mysql import database_error, sorted_error

URL = sa.engine.make_url("mysql+pymysql://u:p@h/db")
PYPROJECT = Path(__file__).parents[3] / "pyproject.toml"


@pytest.fixture
def no_cryptography(monkeypatch: pytest.MonkeyPatch) -> RuntimeError:
    """PyMySQL as installed without `cryptography`; the error its RSA step raises then."""
    monkeypatch.setattr(_auth, "_have_cryptography", False)
    with pytest.raises(RuntimeError) as raised:
        _auth.sha2_rsa_encrypt(b"password", b"12345678901234567890", b"key")
    return raised.value


@pytest.fixture
def handshake_fails(monkeypatch: pytest.MonkeyPatch, no_cryptography: RuntimeError) -> None:
    """Every pymysql.connect() fails as PyMySQL's handshake does without `cryptography`."""

    def connect(*args: object, **kwargs: object) -> None:
        raise no_cryptography

    monkeypatch.setattr(pymysql, "connect", connect)


def assert_says_what_to_install(error: BaseException) -> None:
    assert isinstance(error, MsgtableError), repr(error)
    assert not isinstance(error, Unavailable)  # waiting will not help
    text = str(error)
    assert "\n" not in text
    assert "caching_sha2_password" in text
    assert "pip install 'PyMySQL[rsa]'" in text


def test_msgtable_installs_pymysql_with_its_rsa_extra() -> None:
    # the server's packages are the server extra (the client needs no driver)
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    dependencies = project["optional-dependencies"]["server"]
    assert not [r for r in map(Requirement, project["dependencies"]) if r.name.lower() == "pymysql"]
    pymysql_requirements = [
        r for r in map(Requirement, dependencies) if r.name.lower() == "pymysql"
    ]
    assert [r.extras for r in pymysql_requirements] == [{"rsa"}]


def test_the_missing_cryptography_package_is_one_line_saying_what_to_install(
    no_cryptography: RuntimeError,
) -> None:
    assert_says_what_to_install(database_error(no_cryptography))
    assert_says_what_to_install(sorted_error(no_cryptography))


def test_the_missing_pynacl_package_names_the_ed25519_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_auth, "_nacl_bindings", None)
    monkeypatch.setitem(sys.modules, "nacl", None)  # import nacl fails
    with pytest.raises(RuntimeError) as raised:
        _auth.ed25519_password(b"password", b"scramble")
    error = sorted_error(raised.value)
    assert isinstance(error, MsgtableError) and "pip install 'PyMySQL[ed25519]'" in str(error)


def test_any_other_runtime_error_is_still_a_bug() -> None:
    bug = RuntimeError("something else")
    assert sorted_error(bug) is bug


def test_the_stores_pool_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, no_cryptography: RuntimeError
) -> None:
    def connect(*args: object, **kwargs: object) -> None:
        raise no_cryptography

    dbapi = SimpleNamespace(connect=connect, Error=pymysql.Error)
    dialect = SimpleNamespace(create_connect_args=lambda url: ([], {}), loaded_dbapi=dbapi)
    monkeypatch.setattr(dbpool, "_dialect", lambda url: dialect)
    pool = ConnectionPool(
        URL, {}, autocommit=True, init_command="", max_idle=1, max_connections=1, wait_s=1
    )
    with pytest.raises(MsgtableError) as raised, pool.connection():
        pass
    assert_says_what_to_install(raised.value)


@pytest.mark.usefixtures("handshake_fails")
def test_the_lease_says_what_to_install() -> None:
    lease = Placement(
        connector(URL, "db"), "here:1", units=set, on_gain=print, on_loss=lambda u, s: True
    )
    with pytest.raises(MsgtableError) as raised:
        lease.prepare()
    assert_says_what_to_install(raised.value)


@pytest.mark.usefixtures("handshake_fails")
def test_the_binlog_follower_says_what_to_install() -> None:
    with pytest.raises(MsgtableError) as raised:
        read_status({"host": "h"})
    assert_says_what_to_install(raised.value)


@pytest.mark.usefixtures("handshake_fails")
def test_sparks_connections_say_what_to_install() -> None:
    with pytest.raises(MsgtableError) as raised, connection("mysql://u:p@h/db"):
        pass
    assert_says_what_to_install(raised.value)
