"""SQLite engines: network filesystems are handled explicitly, pragmas, read-only URIs."""

from __future__ import annotations

import errno
import sqlite3
import warnings
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, bindparam, event, select, text
from sqlalchemy.exc import DBAPIError

import store.backends.sqlite.filesystems
from store.backends.sqlite.connections import create_sqlite_engine, readonly_uri
from store.backends.sqlite.errors import translated
from store.backends.sqlite.filesystems import NetworkFilesystemWarning, filesystem_type, journal_mode_for
from store.descriptor import ModelDescriptor
from store.errors import (
    CorruptDatabaseError,
    DamagedTextError,
    DatabaseBusyError,
    DatabaseIOError,
    NetworkFilesystemError,
    NotADatabaseError,
    RefusedValueError,
    SchemaMismatchError,
    StoreFullError,
    StoreNotWritableError,
    UnexpectedDatabaseError,
)
from store.settings import Settings
from store.store import Store
from tests.factories import completion_record, current_database


def mounts(tmp_path: Path, *lines: str) -> Path:
    """A file in /proc/self/mounts format: device, mount point, type, options, dump, pass."""
    path = tmp_path / "mounts"
    path.write_text("".join(line + "\n" for line in ("overlay / overlay rw,relatime 0 0", *lines)))
    return path


@pytest.fixture
def share(tmp_path: Path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    return folder


@pytest.mark.parametrize(
    ("fstype", "device"),
    [("nfs4", "server:/export"), ("nfs", "server:/export"), ("lustre", "10.0.0.1@o2ib:/fs"),
     ("gpfs", "gpfs0"), ("cifs", "//server/share"), ("fuse.sshfs", "me@host:")],
)  # fmt: skip
def test_network_filesystems_get_the_rollback_journal_and_a_warning(
    fstype: str, device: str, share: Path, tmp_path: Path
) -> None:
    table = mounts(tmp_path, f"{device} {share} {fstype} rw,relatime 0 0")
    db_path = share / "role" / "x.db"  # not created yet: its nearest existing ancestor decides
    assert filesystem_type(db_path, table) == fstype
    with pytest.warns(NetworkFilesystemWarning, match=fstype) as caught:
        assert journal_mode_for(db_path, Settings(), table) == "delete"
    assert str(db_path) in str(caught[0].message) and "refuse-network" in str(caught[0].message)


@pytest.mark.parametrize("fstype", ["nfs4", "lustre", "gpfs", "cifs"])
def test_refuse_network_policy_refuses_with_a_typed_error(fstype: str, share: Path, tmp_path: Path) -> None:
    table = mounts(tmp_path, f"server:/x {share} {fstype} rw 0 0")
    with pytest.raises(NetworkFilesystemError, match=fstype) as caught:
        journal_mode_for(share / "x.db", Settings(journal_policy="refuse-network"), table)
    assert str(share / "x.db") in str(caught.value) and "JUDGESTORE_JOURNAL_POLICY" in str(caught.value)


@pytest.mark.parametrize("fstype", ["ext4", "xfs", "overlay", "tmpfs", "btrfs"])
def test_local_filesystems_get_wal_silently(fstype: str, share: Path, tmp_path: Path) -> None:
    table = mounts(tmp_path, f"/dev/sda1 {share} {fstype} rw 0 0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert journal_mode_for(share / "x.db", Settings(), table) == "wal"
        assert journal_mode_for(share / "x.db", Settings(journal_policy="refuse-network"), table) == "wal"


def test_explicit_policies_ignore_the_mount_table(share: Path, tmp_path: Path) -> None:
    table = mounts(tmp_path, f"server:/x {share} nfs4 rw 0 0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert journal_mode_for(share / "x.db", Settings(journal_policy="wal"), table) == "wal"
        assert journal_mode_for(share / "x.db", Settings(journal_policy="rollback"), table) == "delete"


def test_the_deepest_and_latest_mount_wins(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    table = mounts(
        tmp_path,
        f"server:/a {tmp_path / 'a'} nfs4 rw 0 0",
        f"/dev/sdb {inner} ext4 rw 0 0",
        f"/dev/sdc {tmp_path / 'a'} xfs rw 0 0",  # mounted over the NFS share later
    )
    assert filesystem_type(inner / "x.db", table) == "ext4"
    assert filesystem_type(tmp_path / "a" / "x.db", table) == "xfs"
    assert filesystem_type(tmp_path / "ab" / "x.db", table) == "overlay"  # a prefix is not a parent


@pytest.mark.parametrize("name", ["with space", "tab\there", "back\\slash", "données partagées", "new\nline"])
def test_octal_escaped_mount_points_are_understood(name: str, tmp_path: Path) -> None:
    share = tmp_path / name
    share.mkdir()
    escaped = str(share)
    for char, code in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
        escaped = escaped.replace(char, code)
    table = mounts(tmp_path, f"server:/x {escaped} nfs4 rw 0 0")
    assert filesystem_type(share / "x.db", table) == "nfs4"
    assert filesystem_type(tmp_path / "x.db", table) == "overlay"


def test_an_unreadable_mount_table_means_unknown_and_wal(tmp_path: Path) -> None:
    assert filesystem_type(tmp_path / "x.db", tmp_path / "missing") is None
    assert journal_mode_for(tmp_path / "x.db", Settings(), tmp_path / "missing") == "wal"


def test_a_store_on_a_network_filesystem_uses_the_rollback_journal(
    store_root: Path, descriptor: ModelDescriptor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        store.backends.sqlite.filesystems, "MOUNTS_FILE", mounts(tmp_path, f"server:/x {tmp_path} nfs4 rw 0 0")
    )
    with pytest.warns(NetworkFilesystemWarning), Store(root=store_root) as s:
        database = s.database("completions", "t", descriptor)
        database.put_many([completion_record(1)])
        with database.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    assert database.path.read_bytes()[18:20] == b"\x01\x01"  # the file itself is in rollback mode
    assert not Path(f"{database.path}-wal").exists()


def test_a_store_refusing_network_filesystems_creates_no_database(
    store_root: Path, descriptor: ModelDescriptor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        store.backends.sqlite.filesystems, "MOUNTS_FILE", mounts(tmp_path, f"server:/x {tmp_path} lustre rw 0 0")
    )
    with Store(Settings(journal_policy="refuse-network"), root=store_root) as s, pytest.raises(NetworkFilesystemError):
        s.database("completions", "t", descriptor)
    assert not list(store_root.rglob("*.db"))


def test_a_wal_database_moved_to_a_network_filesystem_is_switched_to_rollback(
    store_root: Path, descriptor: ModelDescriptor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor, [completion_record(1)])
    assert db_path.read_bytes()[18:20] == b"\x02\x02"
    monkeypatch.setattr(
        store.backends.sqlite.filesystems, "MOUNTS_FILE", mounts(tmp_path, f"server:/x {tmp_path} nfs rw 0 0")
    )
    with pytest.warns(NetworkFilesystemWarning), Store(root=store_root) as s:
        assert s.database("completions", "t", descriptor).count() == 1
    assert db_path.read_bytes()[18:20] == b"\x01\x01"


# ---------------------------------------------------------------- connections


def test_every_connection_gets_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    engine = create_sqlite_engine(tmp_path / "x.db", Settings(busy_timeout_ms=1234))
    with engine.connect() as a, engine.connect() as b:
        for conn in (a, b):
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1234
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()


def test_a_statement_is_compiled_once_for_every_file_of_a_store(tmp_path: Path) -> None:
    # Each file has its own engine; SQLAlchemy compiles per dialect, so the engines share one (and one cache).
    values = Table("v", MetaData(), Column("n", Integer))
    engines = [create_sqlite_engine(tmp_path / f"{i}.db", Settings()) for i in range(3)]
    compiled = engines[0].get_execution_options()["compiled_cache"]
    query = select(values.c.n).where(values.c.n > bindparam("least"))
    sizes, found = [], []
    for i, engine in enumerate(engines):
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE v (n INTEGER)")
            conn.exec_driver_sql(f"INSERT INTO v VALUES ({i}), ({10 + i})")
        with engine.connect() as conn:
            found.append(conn.execute(query, {"least": i}).scalars().all())
        sizes.append(len(compiled))
        engine.dispose()
    assert found == [[10], [11], [12]]  # each file's own rows, with each call's own parameters
    assert sizes[0] == sizes[1] == sizes[2]  # compiled by the first file's engine, reused by the others
    assert len({id(engine.dialect) for engine in engines}) == 1
    assert engines[0].dialect.server_version_info == sqlite3.sqlite_version_info  # initialised from the library


def test_write_connections_begin_immediate_and_readers_plain_begin(tmp_path: Path) -> None:
    engine = create_sqlite_engine(tmp_path / "x.db", Settings())
    begun: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: begun.append(args[2]) if "BEGIN" in args[2] else None)
    with engine.connect().execution_options(write=True) as conn, conn.begin():
        conn.execute(text("SELECT 1"))
    with engine.connect() as conn, conn.begin():
        conn.execute(text("SELECT 1"))
    engine.dispose()
    assert begun == ["BEGIN IMMEDIATE", "BEGIN"]


def test_readonly_uri_reads_only_a_wal_file_nobody_has_open_as_immutable(
    store_root: Path, descriptor: ModelDescriptor
) -> None:
    db_path = current_database(store_root, "completions", "t", descriptor)
    assert readonly_uri(db_path).endswith("?mode=ro&immutable=1")
    # A -shm: a connection may have the file open (with an empty -wal too: a writer that has not committed since
    # a checkpoint) and would checkpoint under a reader without locks: read under SQLite's locks.
    Path(f"{db_path}-shm").write_bytes(b"")
    Path(f"{db_path}-wal").write_bytes(b"")
    assert readonly_uri(db_path).endswith("?mode=ro")
    Path(f"{db_path}-shm").unlink()  # an empty -wal alone (no connection has it open): the main file is all
    assert readonly_uri(db_path).endswith("?mode=ro&immutable=1")
    Path(f"{db_path}-wal").write_bytes(b"\0" * 32)  # commits in a -wal: SQLite reads them through a -shm
    assert readonly_uri(db_path).endswith("?mode=ro")
    Path(f"{db_path}-wal").unlink()
    # A -shm alone: a killed connection's leftover (one open keeps its -wal); mode=ro would leave a new -wal.
    Path(f"{db_path}-shm").write_bytes(b"\0" * 32768)
    assert readonly_uri(db_path).endswith("?mode=ro&immutable=1")
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert store.database("completions", "t", descriptor).count() == 0
    assert not Path(f"{db_path}-wal").exists()  # nothing was created
    Path(f"{db_path}-shm").unlink()
    rollback = store_root / "rollback.db"
    with closing(sqlite3.connect(rollback)) as conn:
        conn.execute("CREATE TABLE t (x)")
    assert readonly_uri(rollback).endswith("?mode=ro")


def test_readonly_uri_survives_odd_characters_in_the_path(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen%2FQwen3-8B ? # &"
    folder.mkdir()
    db_path = folder / "x.db"
    with closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (42)")
    engine = create_sqlite_engine(db_path, Settings(), readonly=True)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT x FROM t").scalar() == 42
    engine.dispose()
    assert sorted(p.name for p in folder.iterdir()) == ["x.db"]


# ---------------------------------------------------------------- what a failure means


def _sqlite_error(message: str, code: int | None, kind: type[sqlite3.Error] = sqlite3.OperationalError) -> Exception:
    error = kind(message)
    if code is not None:
        error.sqlite_errorcode = code  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(
    ("error", "typed", "words"),
    [
        (_sqlite_error("file is not a database", 26, sqlite3.DatabaseError), NotADatabaseError, "not an SQLite"),
        (_sqlite_error("database disk image is malformed", 11, sqlite3.DatabaseError), CorruptDatabaseError, "damaged"),
        (_sqlite_error("database or disk is full", 13), StoreFullError, "disk is full"),
        (_sqlite_error("attempt to write a readonly database", 8), StoreNotWritableError, "remount it read-write"),
        (_sqlite_error("attempt to write a readonly database", 8 | (1 << 8)), StoreNotWritableError, "read-only"),
        (_sqlite_error("disk I/O error", 10 | (3 << 8)), DatabaseIOError, "judgestore verify"),
        (_sqlite_error("unable to open database file", 14), DatabaseIOError, "permissions"),
        (_sqlite_error("database is locked", 5), DatabaseBusyError, "JUDGESTORE_BUSY_TIMEOUT_MS"),
        (_sqlite_error("Could not decode to UTF-8 column 'completion' with text 'x'", None), DamagedTextError,
         "removes each from this database alone"),
        (_sqlite_error("no such table: completions", 1), SchemaMismatchError, "backup"),
        (_sqlite_error("CHECK constraint failed: orientation", 19 | (1 << 8), sqlite3.IntegrityError),
         RefusedValueError, "a value of it is the cause"),  # was: verify the file, restore or delete it
        (_sqlite_error("something new", 1), UnexpectedDatabaseError, "something new"),
        (sqlite3.InterfaceError("bad parameter"), UnexpectedDatabaseError, "judgestore verify"),
        (OSError(errno.ENOSPC, "No space left on device"), StoreFullError, "disk is full"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), StoreFullError, "disk is full"),
        (OSError(errno.EROFS, "Read-only file system"), StoreNotWritableError, "read-only filesystem"),
        (OSError(errno.EACCES, "Permission denied"), DatabaseIOError, "permission denied"),
        (OSError(errno.EIO, "Input/output error"), DatabaseIOError, "Input/output error"),
    ],
)  # fmt: skip
def test_every_sqlite_or_filesystem_failure_becomes_a_typed_error_naming_the_file(
    error: Exception, typed: type[Exception], words: str, tmp_path: Path
) -> None:
    path = tmp_path / "completions.db"
    for raised in (error, DBAPIError.instance("SELECT 1", None, error, sqlite3.Error)):
        if isinstance(error, OSError) and raised is not error:
            continue
        result = translated(path, raised)  # type: ignore[arg-type]
        assert type(result) is typed
        assert str(result).startswith(f"{path}: ") and words in str(result)


def test_a_failure_the_os_names_a_file_for_is_reported_on_that_file(tmp_path: Path) -> None:
    lock = tmp_path / "completions.db.lock"
    result = translated(tmp_path / "completions.db", OSError(errno.EROFS, "Read-only file system", str(lock)))
    assert isinstance(result, StoreNotWritableError) and result.path == lock


def test_a_full_disk_says_what_is_free_and_what_the_write_needs(tmp_path: Path) -> None:
    full = translated(tmp_path / "x.db", OSError(errno.ENOSPC, "No space left"), needed_bytes=3_400_000)
    assert isinstance(full, StoreFullError)
    assert full.free_bytes is not None and "free on its filesystem" in str(full)
    assert full.needed_bytes == 3_400_000 and "Free at least 3.4 MB" in str(full)
