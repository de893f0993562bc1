"""Every error psycopg can raise reaches the caller of a server store as a typed error naming the server.

Two ways: every exception class psycopg defines (client-side ones, without a
SQLSTATE, included) through :func:`store.backends.postgres.errors.translated`; and each
family raised by the driver itself, on the real server, while a server store
writes and reads (the driver's cursor made to raise it, then a lock the
server really waits on), after which the store is used again as if nothing
happened, and nothing of the failed write was kept.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
import psycopg.errors
import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from store.backends.postgres.connections import display_url
from store.backends.postgres.errors import translated
from store.errors import (
    JudgestoreError,
    ServerAuthError,
    ServerBusyError,
    ServerDamagedError,
    ServerError,
    ServerFullError,
    ServerPermissionError,
    ServerSchemaError,
    ServerUnavailableError,
    ServerURLError,
    ServerValueError,
    UnexpectedServerError,
)
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import QWEN, completion_record
from tests.pg_server import Cluster

URL = "postgresql+psycopg://eval:S3cr3t-pw@db.example:5432/evals?password=Qu3ry-pw"
SECRETS = ("S3cr3t-pw", "Qu3ry-pw")

EVERY_CLASS = sorted(
    (c for c in vars(psycopg.errors).values() if inspect.isclass(c) and issubclass(c, psycopg.Error)),
    key=lambda c: c.__name__,
)

EXPECTED: dict[type[psycopg.Error] | str, type[ServerError]] = {
    # client-side: raised by psycopg itself, without a SQLSTATE
    psycopg.Error: UnexpectedServerError,
    psycopg.InterfaceError: ServerUnavailableError,
    psycopg.DatabaseError: UnexpectedServerError,
    psycopg.DataError: ServerValueError,
    psycopg.OperationalError: ServerUnavailableError,
    psycopg.IntegrityError: ServerValueError,
    psycopg.InternalError: UnexpectedServerError,
    psycopg.ProgrammingError: UnexpectedServerError,
    psycopg.NotSupportedError: UnexpectedServerError,
    psycopg.errors.ConnectionTimeout: ServerUnavailableError,
    psycopg.errors.PipelineAborted: UnexpectedServerError,
    # sent by the server
    "28P01": ServerAuthError,
    "28000": ServerAuthError,
    "3D000": ServerURLError,
    "42501": ServerPermissionError,
    "25006": ServerPermissionError,
    "40001": ServerBusyError,
    "40P01": ServerBusyError,
    "55P03": ServerBusyError,
    "57014": ServerBusyError,
    "53100": ServerFullError,
    "53200": ServerFullError,
    "53300": ServerUnavailableError,
    "57P01": ServerUnavailableError,
    "08006": ServerUnavailableError,
    "42P01": ServerSchemaError,
    "42703": ServerSchemaError,
    "22021": ServerValueError,
    "22001": ServerValueError,
    "22012": ServerValueError,  # a division by zero in Store.execute's statement
    "23505": ServerValueError,
    "23514": ServerValueError,
    "54000": ServerValueError,  # e.g. an index row too large
    "58030": ServerDamagedError,  # an I/O error on the server
    "P0001": UnexpectedServerError,
    "XX001": ServerDamagedError,
    "XX000": ServerDamagedError,
    "0A000": UnexpectedServerError,
    "42601": UnexpectedServerError,
    "25P02": UnexpectedServerError,
}


# Raised on a real server store's writes and reads: every client-side class, and one SQLSTATE of each family.
END_TO_END = [k for k in EXPECTED if not isinstance(k, str)] + [
    "28P01", "42501", "25006", "40001", "55P03", "53100", "57P01", "42P01", "22021", "23514", "XX001", "0A000",
]  # fmt: skip


def wrapped(error: psycopg.Error) -> DBAPIError:
    """``error`` as SQLAlchemy hands it on (its DBAPIError subclass chosen by the driver class)."""
    return DBAPIError.instance("INSERT INTO completions ...", {}, error, psycopg.Error)


def _class_of(key: type[psycopg.Error] | str) -> type[psycopg.Error]:
    return psycopg.errors.lookup(key) if isinstance(key, str) else key


@pytest.mark.parametrize("error_class", EVERY_CLASS, ids=lambda c: c.__name__)
def test_every_psycopg_error_class_is_a_typed_error_naming_the_server_and_no_password(
    error_class: type[psycopg.Error],
) -> None:
    message = f"something failed: password=S3cr3t-pw ({error_class.__name__})"  # a driver quoting a secret
    typed = translated(URL, wrapped(error_class(message)))
    assert isinstance(typed, ServerError)
    text = str(typed)
    assert text.startswith(display_url(URL) + ": ") and error_class.__name__ in text
    assert not any(secret in text for secret in SECRETS), text


@pytest.mark.parametrize("key", EXPECTED, ids=lambda k: k if isinstance(k, str) else k.__name__)
def test_each_kind_of_driver_error_gets_its_own_class(key: type[psycopg.Error] | str) -> None:
    typed = translated(URL, wrapped(_class_of(key)("it failed")))
    assert type(typed) is EXPECTED[key], (key, typed)


# ---------------------------------------------------------------- raised by the driver, on a real server


@pytest.fixture
def server(pg_url: str) -> Iterator[Store]:
    with Store(Settings(lock_retries=1), url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
        yield store


class Failing:
    """psycopg's cursors (a query streams through a server-side one) made to raise ``error`` on every statement
    that touches the completions table."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.error: psycopg.Error | None = None
        for cursor, name in ((psycopg.Cursor, "execute"), (psycopg.Cursor, "executemany"),
                             (psycopg.ServerCursor, "execute")):  # fmt: skip
            monkeypatch.setattr(cursor, name, self._failing(getattr(cursor, name)))

    def _failing(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(cursor: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
            if self.error is not None and "completions" in str(query):
                raise self.error
            return real(cursor, query, *args, **kwargs)

        return call


OPERATIONS: dict[str, Callable[[Any], object]] = {
    "put_many": lambda db: db.put_many([completion_record(2), completion_record(3)]),
    "get_many": lambda db: db.get_many([completion_record(1).input_hash]),
    "count": lambda db: db.count(),
    "query": lambda db: list(db.query()),
}


@pytest.mark.postgres
@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("key", END_TO_END, ids=lambda k: k if isinstance(k, str) else k.__name__)
def test_a_driver_error_on_a_write_or_a_read_reaches_the_caller_typed_and_the_store_goes_on(
    key: type[psycopg.Error] | str, operation: str, server: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = server.open(server.locations()[0])
    failing = Failing(monkeypatch)
    failing.error = _class_of(key)("the driver failed here")
    with pytest.raises(JudgestoreError) as caught:
        OPERATIONS[operation](database)
    assert type(caught.value) is EXPECTED[key]
    assert str(caught.value).startswith(server.where) and "the driver failed here" in str(caught.value)
    failing.error = None
    assert database.count() == 1  # nothing of a failed write was kept
    assert database.put_many([completion_record(4)]) == 1 and database.count() == 2


@pytest.mark.postgres
@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_lock_the_server_cannot_get_in_time_is_a_busy_error_on_a_write_and_a_read(
    operation: str, pg_url: str, pg_cluster: Cluster
) -> None:
    """Not made up: another session holds the table, the server gives up waiting (lock_timeout, 55P03)."""
    with Store(url=pg_url) as store:
        location = store.database("completions", "t", QWEN).location
    impatient = pg_url + "&options=-c%20lock_timeout%3D200"
    database = make_url(pg_url).database
    assert database is not None

    @contextmanager
    def table_locked() -> Iterator[None]:
        from store.backends.postgres.registry import schema_name

        with psycopg.connect(host=pg_cluster.socket_dir, user="postgres", dbname=database) as conn:
            conn.execute(f'LOCK TABLE "{schema_name(location)}".completions IN ACCESS EXCLUSIVE MODE')
            yield

    with held_by_another_session(table_locked), Store(Settings(lock_retries=0), url=impatient) as store:
        with pytest.raises(ServerBusyError, match="a lock it could not get") as caught:
            OPERATIONS[operation](store.open(location))
        assert "Run the command again" in str(caught.value)
    with Store(url=pg_url) as store:
        assert store.open(location).count() == 0


@pytest.mark.postgres
@pytest.mark.parametrize("operation", ["put_many", "delete"])
def test_a_table_lock_held_by_another_tool_bounds_a_write_and_names_the_schema(
    operation: str, pg_url: str, pg_cluster: Cluster
) -> None:
    """A LOCK TABLE in psql (an ALTER, a VACUUM FULL) on a descriptor's table, the URL setting no lock_timeout:
    a write waited until it was released, however long, once the schema's write lock was free (was), and a
    busy error named the server only (which of thousands of schemas?)."""
    from store.backends.postgres.registry import schema_name

    with Store(url=pg_url) as store:
        location = store.database("completions", "t", QWEN).location
        store.open(location).put_many([completion_record(1)])
    database = make_url(pg_url).database
    assert database is not None
    writes: dict[str, Callable[[Any], object]] = {
        "put_many": lambda db: db.put_many([completion_record(2)]),
        "delete": lambda db: db.delete(RowFilter(model=completion_record(1).model)),
    }

    @contextmanager
    def table_locked() -> Iterator[None]:
        with psycopg.connect(host=pg_cluster.socket_dir, user="postgres", dbname=database) as conn:
            conn.execute(f'LOCK TABLE "{schema_name(location)}".completions IN ACCESS EXCLUSIVE MODE')
            yield

    with (
        held_by_another_session(table_locked),
        Store(Settings(busy_timeout_ms=300, lock_retries=1), url=pg_url) as store,
    ):
        started = time.monotonic()
        with pytest.raises(ServerBusyError, match="a lock it could not get") as caught:
            writes[operation](store.open(location))
        waited = time.monotonic() - started
    assert waited < 20  # the holder keeps the table for a minute
    assert schema_name(location) in str(caught.value)
    with Store(url=pg_url) as store:
        assert store.open(location).count() == 1  # nothing of the refused write


@contextmanager
def held_by_another_session(hold: Callable[[], AbstractContextManager[None]]) -> Iterator[None]:
    """The block runs while a thread holds what ``hold()`` takes (another session's lock), given back after it."""
    holding, release = threading.Event(), threading.Event()

    def run() -> None:
        with hold():
            holding.set()
            release.wait(60)

    holder = threading.Thread(target=run)
    holder.start()
    try:
        assert holding.wait(30)
        yield
    finally:
        release.set()
        holder.join()


@pytest.mark.postgres
def test_a_writer_waits_for_another_sessions_write_lock_as_long_as_a_locked_file_then_says_busy(pg_url: str) -> None:
    """A session holding the schema's write lock (a job suspended inside a write) held every other writer for as
    long as it held it, without a word (was): the wait is the busy timeout times the tries, then a busy error."""
    from store.backends.postgres.generations import write_lock
    from store.backends.postgres.registry import schema_name

    with Store(url=pg_url) as store:
        location = store.database("completions", "t", QWEN).location

    @contextmanager
    def write_locked() -> Iterator[None]:
        with Store(url=pg_url) as store, store.storage.connect() as conn, conn.begin():  # type: ignore[attr-defined]
            write_lock(conn, schema_name(location))
            yield

    with (
        held_by_another_session(write_locked),
        Store(Settings(busy_timeout_ms=400, lock_retries=2), url=pg_url) as store,
    ):
        started = time.monotonic()
        with pytest.raises(ServerBusyError, match="a lock it could not get"):
            store.open(location).put_many([completion_record(1)])
        waited = time.monotonic() - started
    assert 1.1 < waited < 20  # 400 ms times 3 tries, not the minute the holder would have held it
    with Store(url=pg_url) as store:
        assert store.open(location).count() == 0  # nothing of the refused write
        assert store.open(location).put_many([completion_record(1)]) == 1  # free again: the next write goes in


@pytest.mark.postgres
def test_a_statement_binding_more_values_than_postgresql_takes_says_so_not_that_the_server_is_gone(
    pg_url: str,
) -> None:
    """An IN list of 70,000 hashes (the README's filter on a result file's hashes) was "cannot reach the server;
    is it running, and is the URL right?" (was)."""
    from sqlalchemy import func, select

    from store import Completion

    with Store(url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
        hashes = [f"{i:064x}" for i in range(70_000)] + [completion_record(1).input_hash]
        with pytest.raises(ServerValueError, match="Split a long IN") as caught:
            statement = select(func.count()).select_from(Completion).where(Completion.input_hash.in_(hashes))
            store.execute(statement).scalar_one()
        assert "cannot reach" not in str(caught.value)
        counted = store.execute(
            select(func.count()).select_from(Completion).where(Completion.input_hash.in_(hashes[-60_000:]))
        )
        assert counted.scalar_one() == 1  # under the limit the same statement runs: the server was there all along
        database = store.open(store.locations()[0])
        with pytest.raises(ServerValueError, match="Split a long IN") as refused:  # a row filter's
            database.count(RowFilter(input_hashes=hashes))
        notes = getattr(refused.value, "__notes__", [])
        assert not any("try again later" in note for note in notes)  # nine tries over 33 s, then that note (was)


@pytest.mark.postgres
def test_results_left_half_read_holding_every_pooled_connection_give_a_busy_error_naming_them(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next query waited for the pool, then raised SQLAlchemy's own TimeoutError, untyped (was)."""
    from sqlalchemy import select

    from store import Completion

    with Store(Settings(pool_size=1, pool_overflow=0), url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(i) for i in range(3)])
        monkeypatch.setattr(store.storage.engine.pool, "_timeout", 0.3)  # type: ignore[attr-defined]
        half_read = store.scalars(select(Completion))
        next(half_read)
        with pytest.raises(ServerBusyError, match="not read to its end holds one") as caught:
            store.execute(select(Completion.input_hash)).all()
        assert "JUDGESTORE_POOL_SIZE" in str(caught.value)
        with pytest.raises(ServerBusyError):
            store.open(store.locations()[0]).count()
        with pytest.raises(ServerBusyError, match="not read to its end holds one"):  # a new schema's creation too
            store.database("completions", "t2", QWEN).count()
        half_read.close()  # given back: the next query runs
        assert store.open(store.locations()[0]).count() == 3


def test_a_permission_denied_on_a_table_asks_for_table_grants_not_create() -> None:
    """(Was: "needs CREATE on the database", for a role that may read but not delete.)"""
    denied = psycopg.errors.lookup("42501")("permission denied for table completions")
    typed = translated(URL, wrapped(denied))
    assert type(typed) is ServerPermissionError
    assert "SELECT, INSERT, UPDATE and DELETE on the schema's tables" in str(typed) and "CREATE on" not in str(typed)
    schemas = translated(URL, wrapped(psycopg.errors.lookup("42501")("permission denied for database evals")))
    assert "CREATE on the database" in str(schemas)


@pytest.mark.postgres
def test_a_value_of_the_callers_own_statement_the_server_refuses_is_said_to_be_the_cause(pg_url: str) -> None:
    """A U+0000 in a literal of the caller's expression (the store escapes only the values it binds itself) was
    "judgestore checks values before it sends them: please report this value", to a user who wrote it."""
    from store import Completion

    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
        with pytest.raises(ServerValueError) as refused:
            store.execute(select(func.replace(Completion.completion, "\x00", "N"))).all()
        assert "if the statement is your own (Store.execute, a session), a value of it is the cause" in str(
            refused.value
        )
        assert store.execute(select(func.count()).select_from(Completion)).all() == [(1,)]  # the store goes on


@pytest.mark.postgres
def test_a_role_the_server_limits_hears_what_it_lacks_and_what_to_do(pg_url: str, pg_cluster: Cluster) -> None:
    """Said by a real server: no USAGE on a descriptor schema (was: "needs CREATE on the database"), a
    statement_timeout (was: "run the command again", which fails the same way), no connection slot free (was:
    "is it running?")."""
    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(i) for i in range(3)])
        (location,) = store.locations()
    database = make_url(pg_url).database
    assert database is not None
    pg_cluster.sql(
        "DO $$ BEGIN CREATE ROLE limited LOGIN PASSWORD 'pw'; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    pg_cluster.sql("ALTER ROLE limited CONNECTION LIMIT -1")
    for statement in ("GRANT USAGE ON SCHEMA judgestore TO limited", "GRANT SELECT ON judgestore.registry TO limited"):
        pg_cluster.sql(statement, database)
    limited = pg_cluster.url(database, "limited", "pw")
    with Store(Settings(lock_retries=0), url=limited, readonly=True) as store:
        with pytest.raises(ServerPermissionError, match="USAGE on each judgestore schema") as denied:
            store.open(location).count()
        assert "CREATE on the database" not in str(denied.value)
    with Store(Settings(lock_retries=0), url=f"{pg_url}&options=-c%20statement_timeout%3D300") as store:
        session = store.open(location).session()
        with pytest.raises(ServerBusyError, match="statement_timeout") as timed_out, session as s:
            s.execute(text("SELECT pg_sleep(1)"))
        assert "ALTER ROLE" in str(timed_out.value) and "Run the command again" not in str(timed_out.value)
    pg_cluster.sql("ALTER ROLE limited CONNECTION LIMIT 0")
    with Store(Settings(lock_retries=0), url=limited, readonly=True) as store:
        with pytest.raises(ServerUnavailableError, match="no connection slot free") as full:
            store.locations()
        assert "JUDGESTORE_POOL_SIZE" in str(full.value) and "is it running" not in str(full.value)


@pytest.mark.postgres
@pytest.mark.parametrize("read", ["get_many", "count"])
def test_a_read_whose_connection_is_lost_once_runs_again_as_a_write_does(server: Store, read: str) -> None:
    """Was: a copy's read-back of a chunk (get_many) failed the whole copy when one connection was terminated."""
    database = server.open(server.locations()[0])
    lost: list[str] = []

    def lose_it_once(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> tuple[Any, Any]:
        if not lost and "completions" in statement:  # the server ends this very session, once
            lost.append(statement)
            return "SELECT pg_terminate_backend(pg_backend_pid())", ()
        return statement, parameters

    event.listen(server.storage.engine, "before_cursor_execute", lose_it_once, retval=True)  # type: ignore[attr-defined]
    try:
        key = completion_record(1).input_hash
        answer = database.get_many([key]) if read == "get_many" else database.count()
    finally:
        event.remove(server.storage.engine, "before_cursor_execute", lose_it_once)  # type: ignore[attr-defined]
    assert lost  # the first attempt did lose its connection
    assert (set(answer) == {key}) if read == "get_many" else (answer == 1)


@pytest.mark.postgres
def test_a_column_the_registry_lost_is_damage_not_the_statements(pg_url: str, pg_cluster: Cluster) -> None:
    """Its columns are judgestore's: a lost one was called "a column that is not judgestore's" (was)."""
    with Store(Settings(), url=pg_url) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(1)])
    database = make_url(pg_url).database
    assert database is not None
    pg_cluster.sql("ALTER TABLE judgestore.registry DROP COLUMN metadata_json", database)
    with Store(Settings(lock_retries=0), url=pg_url, readonly=True) as store, pytest.raises(ServerSchemaError):
        store.open(store.locations()[0]).count()
