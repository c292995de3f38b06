"""msgtable.testing.devdb without a server: finding binaries, versions, command lines, names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from msgtable.core.sql import quote_database_name
from msgtable.errors import InvalidArgument, MsgtableError, ServerBinaryNotFound
from msgtable.testing import ExternalServer, devdb, mysqld
from msgtable.testing.devdb import LocalServer
from msgtable.testing.mysqld import (
    INSTALL_HINT,
    ServerVersion,
    find_install_db,
    find_server_binary,
    install_command,
    parse_version,
    server_command,
)

MARIADB = ServerVersion("mariadb", (10, 11, 6), "mariadbd  Ver 10.11.6-MariaDB")
MYSQL = ServerVersion("mysql", (8, 0, 36), "mysqld  Ver 8.0.36")
MYSQL_84 = ServerVersion("mysql", (8, 4, 2), "mysqld  Ver 8.4.2")


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def no_binary_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mysqld.BINARY_ENV, raising=False)


@pytest.mark.parametrize(
    ("text", "flavour", "version"),
    [
        (
            "/usr/sbin/mariadbd  Ver 10.11.6-MariaDB-0+deb12u1 for debian-linux-gnu on x86_64"
            " (Debian 12)",
            "mariadb",
            (10, 11, 6),
        ),
        # Debian's /usr/sbin/mysqld is a link to mariadbd: the name says nothing.
        (
            "/usr/sbin/mysqld  Ver 10.6.18-MariaDB-0ubuntu0.22.04.1 for debian-linux-gnu",
            "mariadb",
            (10, 6, 18),
        ),
        ("mariadbd  Ver 11.4.2-MariaDB for osx10.19 on arm64 (Homebrew)", "mariadb", (11, 4, 2)),
        (
            "/usr/sbin/mysqld  Ver 8.0.36-0ubuntu0.22.04.1 for Linux on x86_64 ((Ubuntu))",
            "mysql",
            (8, 0, 36),
        ),
        (
            "mysqld  Ver 8.4.0 for Linux on x86_64 (MySQL Community Server - GPL)",
            "mysql",
            (8, 4, 0),
        ),
        (
            "mysqld  Ver 8.0.35-27 for Linux on x86_64 (Percona Server (GPL), Release '27')",
            "mysql",
            (8, 0, 35),
        ),
    ],
)
def test_version_output_is_parsed_into_flavour_and_version(
    text: str, flavour: str, version: tuple[int, int, int]
) -> None:
    parsed = parse_version(text)
    assert (parsed.flavour, parsed.version) == (flavour, version)


def test_unparseable_version_output_is_an_error() -> None:
    with pytest.raises(MsgtableError, match="cannot read a server version"):
        parse_version("segmentation fault")


@pytest.mark.parametrize(
    ("flavour", "version", "supported"),
    [
        ("mariadb", (10, 5, 20), False),
        ("mariadb", (10, 6, 0), True),
        ("mariadb", (11, 4, 2), True),
        ("mysql", (5, 7, 44), False),
        ("mysql", (8, 0, 11), True),
        ("mysql", (9, 1, 0), True),
    ],
)
def test_only_mariadb_10_6_and_mysql_8_are_supported(
    flavour: mysqld.Flavour, version: tuple[int, int, int], supported: bool
) -> None:
    assert ServerVersion(flavour, version, "").supported is supported


def test_binary_on_path_is_found_first(tmp_path: Path) -> None:
    on_path = executable(tmp_path / "bin" / "mysqld")
    executable(tmp_path / "sbin" / "mariadbd")
    found = find_server_binary(path=str(tmp_path / "bin"), search_dirs=[str(tmp_path / "sbin")])
    assert found == on_path


def test_mariadbd_is_preferred_to_mysqld_in_the_same_place(tmp_path: Path) -> None:
    executable(tmp_path / "mysqld")
    mariadbd = executable(tmp_path / "mariadbd")
    assert find_server_binary(path=str(tmp_path), search_dirs=[]) == mariadbd


def test_well_known_directories_are_searched_when_path_has_none(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    non_executable = tmp_path / "first" / "mariadbd"
    non_executable.parent.mkdir()
    non_executable.write_text("")
    mysqld = executable(tmp_path / "second" / "mysqld")
    dirs = [str(tmp_path / "missing"), str(tmp_path / "first"), str(tmp_path / "second")]
    assert find_server_binary(path=str(empty), search_dirs=dirs) == mysqld


def test_no_binary_anywhere_is_none(tmp_path: Path) -> None:
    assert find_server_binary(path=str(tmp_path), search_dirs=[str(tmp_path)]) is None


def test_environment_variable_overrides_the_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = executable(tmp_path / "custom" / "my-mysqld")
    executable(tmp_path / "mariadbd")
    monkeypatch.setenv(mysqld.BINARY_ENV, str(mine))
    assert find_server_binary(path=str(tmp_path), search_dirs=[]) == mine
    monkeypatch.setenv(mysqld.BINARY_ENV, str(tmp_path / "nothing-here"))
    with pytest.raises(ServerBinaryNotFound, match=r"MSGTABLE_MYSQLD=.*nothing-here"):
        find_server_binary(path=str(tmp_path), search_dirs=[])


def test_install_hint_says_how_to_get_a_server() -> None:
    assert "apt-get install mariadb-server" in INSTALL_HINT
    assert "brew install" in INSTALL_HINT
    assert mysqld.BINARY_ENV in INSTALL_HINT


def test_mysql_initialises_itself_insecurely(tmp_path: Path) -> None:
    binary = tmp_path / "mysqld"
    command = install_command(binary, MYSQL, tmp_path / "data", as_root=False)
    assert command == [
        str(binary),
        "--no-defaults",
        "--initialize-insecure",
        f"--datadir={tmp_path / 'data'}",
    ]
    assert install_command(binary, MYSQL, tmp_path / "data", as_root=True)[-1] == "--user=root"


def test_a_server_unpacked_into_a_private_prefix_runs_through_its_own_loader(
    tmp_path: Path,
) -> None:
    # .ci/mysql-install unpacks Debian unstable's MySQL, built for a newer libc, into a prefix.
    binary = executable(tmp_path / "prefix" / "usr" / "sbin" / "mysqld")
    lib = tmp_path / "prefix" / "usr" / "lib" / "x86_64-linux-gnu"
    loader = executable(lib / "ld-linux-x86-64.so.2")
    assert mysqld.launcher(binary) == [
        str(loader),
        "--library-path",
        f"{lib}:{tmp_path / 'prefix' / 'lib' / 'x86_64-linux-gnu'}",
        str(binary),
    ]
    usr = tmp_path / "prefix" / "usr"
    options = [
        f"--basedir={usr}",
        f"--lc-messages-dir={usr / 'share' / 'mysql'}",
        f"--plugin-dir={usr / 'lib' / 'mysql' / 'plugin'}",
    ]
    command = install_command(binary, MYSQL, tmp_path / "data", as_root=False)
    assert command[:8] == [*mysqld.launcher(binary), "--no-defaults", *options]
    started = server_command(
        binary,
        MYSQL,
        datadir=tmp_path / "d",
        socket_path=tmp_path / "s",
        port=3307,
        binlog=True,
        as_root=False,
    )
    assert started[:8] == [*mysqld.launcher(binary), "--no-defaults", *options]


def test_an_installed_server_runs_itself(tmp_path: Path) -> None:
    binary = executable(tmp_path / "usr" / "sbin" / "mysqld")  # no loader beside it
    assert mysqld.launcher(binary) == [str(binary)]
    assert mysqld.launcher(Path("/usr/sbin/mysqld")) == ["/usr/sbin/mysqld"]
    assert mysqld.prefix_options(binary) == []


def test_mariadb_initialises_with_the_install_script_of_its_installation(tmp_path: Path) -> None:
    binary = executable(tmp_path / "sbin" / "mariadbd")
    script = executable(tmp_path / "bin" / "mariadb-install-db")
    assert find_install_db(binary) == script
    command = install_command(binary, MARIADB, tmp_path / "data", as_root=True)
    assert command[:2] == [str(script), "--no-defaults"]
    for option in (
        f"--datadir={tmp_path / 'data'}",
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
        "--user=root",
    ):
        assert option in command


def test_mariadb_without_install_script_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mysqld, "find_install_db", lambda binary: None)
    with pytest.raises(ServerBinaryNotFound, match="mariadb-install-db"):
        install_command(tmp_path / "mariadbd", MARIADB, tmp_path / "data", as_root=False)


def command_for(version: ServerVersion, *, binlog: bool = True, as_root: bool = False) -> list[str]:
    return server_command(
        Path("/x/mysqld"),
        version,
        datadir=Path("/d"),
        socket_path=Path("/d/mysqld.sock"),
        port=3307,
        binlog=binlog,
        as_root=as_root,
    )


def test_server_reads_no_option_files_and_listens_only_on_loopback() -> None:
    command = command_for(MARIADB)
    assert command[:2] == ["/x/mysqld", "--no-defaults"]
    for option in (
        "--datadir=/d",
        # its own temporary files: a server starting deletes every #sql* file of its tmpdir,
        # which in /tmp were the files of every other server running (error 6 mid-query)
        "--tmpdir=/d",
        "--socket=/d/mysqld.sock",
        "--pid-file=/d/mysqld.pid",
        "--log-error=/d/error.log",
        "--port=3307",
        "--bind-address=127.0.0.1",
        "--performance-schema=OFF",
        "--innodb-buffer-pool-size=256M",
        "--innodb-flush-log-at-trx-commit=2",
        "--sync-binlog=0",
        "--max-connections=500",
    ):
        assert option in command
    assert len(set(command)) == len(command)


def test_binlog_is_row_based_with_full_images_or_off() -> None:
    with_binlog = command_for(MARIADB, binlog=True)
    for option in ("--server-id=1", "--log-bin=binlog", "--binlog-format=ROW"):
        assert option in with_binlog
    assert "--binlog-row-image=FULL" in with_binlog
    assert "--binlog-row-metadata=FULL" in with_binlog  # table events need column names
    # MySQL's binlog shows each statement's text as MariaDB's does by default: the follower
    # tells msgtable's own writes from the application's by it
    assert "--binlog-rows-query-log-events=ON" in command_for(MYSQL, binlog=True)
    assert "--binlog-rows-query-log-events=ON" not in with_binlog
    without = command_for(MYSQL, binlog=False)
    assert "--skip-log-bin" in without
    assert not [arg for arg in without if arg.startswith(("--log-bin", "--binlog"))]


def test_root_must_ask_to_run_as_root() -> None:
    assert "--user=root" in command_for(MARIADB, as_root=True)
    assert "--user=root" not in command_for(MARIADB, as_root=False)


def test_mysql_gets_its_own_options_and_mariadb_does_not() -> None:
    mysql_only = {"--mysqlx=OFF", "--secure-file-priv=NULL"}
    assert mysql_only <= set(command_for(MYSQL))
    assert not mysql_only & set(command_for(MARIADB))
    assert "--mysql-native-password=ON" in command_for(MYSQL_84)
    assert "--mysql-native-password=ON" not in command_for(MYSQL)
    # MySQL's rows read per table (performance_schema) count as MariaDB's (userstat) do
    assert "--performance-schema=ON" in command_for(MYSQL)
    assert "--performance-schema=OFF" in command_for(MARIADB)


@pytest.mark.parametrize("name", ["t_abc_1", "A", "x" * 64, "msgtable"])
def test_plain_database_names_are_quoted(name: str) -> None:
    assert quote_database_name(name) == f"`{name}`"


@pytest.mark.parametrize("name", ["", "x" * 65, "a`b", "a b", "a-b", "db;drop", "é"])
def test_other_database_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument):
        quote_database_name(name)


def test_a_server_that_is_not_started_has_no_port() -> None:
    server = LocalServer()
    with pytest.raises(MsgtableError, match="not started"):
        _ = server.port
    server.stop()  # a no-op, and it stays one
    server.stop()
    assert not server.running


def test_start_without_a_binary_says_how_to_install_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devdb, "find_server_binary", lambda: None)
    with pytest.raises(ServerBinaryNotFound) as raised:
        LocalServer().start()
    assert INSTALL_HINT in str(raised.value)


def test_external_server_swaps_only_the_database() -> None:
    server = ExternalServer("mysql+pymysql://u:p%40ss@db.example:3307/ignored?charset=utf8mb4")
    assert server.dsn("t_1") == "mysql+pymysql://u:p%40ss@db.example:3307/t_1?charset=utf8mb4"
    assert server.dsn() == "mysql+pymysql://u:p%40ss@db.example:3307/?charset=utf8mb4"
    with pytest.raises(InvalidArgument):
        server.dsn("bad name")


def test_template_cache_can_be_moved_or_turned_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(mysqld.CACHE_ENV, str(tmp_path))
    assert mysqld.template_cache_dir() == tmp_path
    monkeypatch.setenv(mysqld.CACHE_ENV, "off")
    assert mysqld.template_cache_dir() is None
    monkeypatch.delenv(mysqld.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert mysqld.template_cache_dir() == tmp_path / "msgtable" / "devdb"


def test_copies_of_the_template_keep_their_bytes_but_not_their_zeros(tmp_path: Path) -> None:
    source = tmp_path / "ib_logfile0"
    content = b"head" + bytes(5 << 20) + b"middle" + bytes(3 << 20)
    source.write_bytes(content)
    source.chmod(0o640)
    target = tmp_path / "copy"
    mysqld._copy_sparse(str(source), str(target))
    assert target.read_bytes() == content
    assert os.stat(target).st_mode == os.stat(source).st_mode
    assert os.stat(target).st_blocks * 512 < len(content)
