"""What a failure on a PostgreSQL server means: every driver error as a typed error naming the server and the next step.

Contract: :func:`translated` turns everything the driver raises into a typed
error (server down, wrong password, no such database, no permission, busy,
full, a refused value, an edited schema, damage; the rest an
:class:`~store.errors.UnexpectedServerError` with the driver's words, any
password it quotes removed) that names the server and the next step.
"""

from __future__ import annotations

import re
from typing import NoReturn

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, InterfaceError, OperationalError

from store.backends.postgres.connections import _without_secrets, display_url
from store.backends.postgres.registry import REGISTRY_SCHEMA, registry_metadata
from store.errors import (
    DamagedValueError,
    JudgestoreError,
    ServerAuthError,
    ServerBusyError,
    ServerDamagedError,
    ServerFullError,
    ServerPermissionError,
    ServerSchemaError,
    ServerUnavailableError,
    ServerURLError,
    ServerValueError,
    UnexpectedServerError,
)
from store.schema import foreign_name_error

# SQLSTATE classes and codes (PostgreSQL's appendix A) -> what they mean for a store
_BUSY_STATES = {"40001": "a serialisation failure", "40P01": "a deadlock", "55P03": "a lock it could not get",
                "55006": "an object another session was using", "57014": "a statement cancelled (statement_timeout?)",
                "57P04": "a statement cancelled (the database is being dropped?)"}  # fmt: skip


_GONE_STATES = {"57P01", "57P02", "57P03", "53300"}  # shut down, crashed, starting; no connection slot free


_MISSING_STATES = {"42P01", "42703", "3F000"}  # undefined table, column, schema
# The server's words for a name a statement uses that a schema lacks (the name unqualified), and the registry's own
_MISSING_NAME = re.compile(r'^(?P<kind>column|relation) "?(?:[^"\s]+\.)?(?P<name>[^"\s.]+)"? does not exist')
_REGISTRY_NAMES = frozenset(
    {REGISTRY_SCHEMA, *(name for t in registry_metadata.tables.values() for name in (t.name, *t.c.keys()))}
)
_FOREIGN_HINT = (
    "a typo, or one added by hand: across schemas a server store reads judgestore's columns only; read the others "
    "in a session on one database, Store.database(...).session()"
)
_ALTERED_STATES = {"42883", "42804"}  # no such operator or function for a column's type, a type mismatch


# Granted rights do not let one login alter a table another created: ownership does (README, "Running on a cluster")
OWNER_ADVICE = (
    "Altering a table (as an upgrade does) takes its owner: the login that created the schema, or a member of its "
    "role. A team shares one owner role (GRANT eval TO alice; and options=-crole%3Deval in each member's URL); "
    "ALTER SCHEMA ... OWNER TO and ALTER TABLE ... OWNER TO hand a schema made otherwise to it"
)


def _sqlstate(error: DBAPIError) -> str | None:
    return getattr(error.orig, "sqlstate", None)


# What psycopg says of a value the server sent that Python has no value for (a time of 'infinity', a year past 9999)
_UNLOADABLE = re.compile(r"^(timestamp|date|time)\w* too (large|small)|^can't parse")
_NO_DATABASE = re.compile(r'database ".*" does not exist')
# A connection option's value refused before any server is asked: psycopg's (connect_timeout) or libpq's words
_BAD_OPTION_VALUE = re.compile(
    r"^(connection is bad: )?(bad value for \w+|invalid \w+ value|invalid integer value|invalid port number)"
)
_BAD_SETTING = re.compile(r"invalid value for parameter|unrecognized configuration parameter")
_NO_SLOT = re.compile(r"too many connections|too many clients|remaining connection slots are reserved")


def translated(url: str, error: DBAPIError, *, where: str | None = None) -> JudgestoreError:
    """The typed error a driver failure stands for: every one has a class (see the module docstring).

    The message names the server (password hidden: :func:`display_url`), says
    what happened in the driver's words (any password in them hidden too),
    and the next step. ``where``: the schema the transaction wrote or read
    (:meth:`Server.location_where`), named instead of the server by a busy
    error, whose lock is that schema's.
    """
    shown = display_url(url)
    state = _sqlstate(error) or ""
    orig = error.orig if error.orig is not None else error
    raw = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    # Read in the driver's words, shown without the password: blanked first, a password that is a word of the
    # message ("password", "failed") made an authentication failure read as a server that cannot be reached (was)
    message = _without_secrets(raw, url)
    kind = type(orig).__name__
    if state == "28P01" or "password authentication failed" in raw:
        return ServerAuthError(shown, f"the server refused the credentials ({message}); check the user and password")
    if state.startswith("28"):
        return ServerAuthError(shown, f"the server refused the connection ({message})")
    if "no password supplied" in raw:  # libpq's own words, before any SQLSTATE: the server asked for one
        return ServerAuthError(
            shown, f"the server asks for a password and none was given ({message}); put it in ~/.pgpass or "
            "PGPASSWORD (a URL that holds it shows it to whoever reads the job script)"
        )  # fmt: skip
    if not state and raw.startswith("invalid connection option"):  # libpq's, for the URL's query string
        return ServerURLError(
            shown, f"the URL names an option libpq does not know ({message}); fix the URL (its query string takes "
            "libpq's connection options: host, port, sslmode, application_name...)"
        )  # fmt: skip
    if not state and _BAD_OPTION_VALUE.search(raw):  # psycopg's or libpq's, for a value in the query string
        return ServerURLError(
            shown, f"the URL gives a connection option a value libpq refuses ({message}); fix the URL"
        )  # fmt: skip
    if not state and _BAD_SETTING.search(raw):  # the server refused a setting of the URL's options (-c name=value)
        return ServerURLError(
            shown, f"the URL's options give the server a setting it refuses ({message}); fix the URL's options"
        )
    if state == "3D000" or (not state and _NO_DATABASE.search(raw)):  # refused at connect: libpq's message
        return ServerURLError(shown, f"{message}; create it (createdb) or fix the URL")
    if not state and "permission denied for database" in raw:  # refused at connect (libpq's words): CONNECT
        return ServerPermissionError(
            shown, f"{message}; the store's user needs CONNECT on the database (GRANT CONNECT ON DATABASE ... TO ...)"
        )
    if state == "42501" and "permission denied for table" in raw:
        return ServerPermissionError(
            shown,
            f"{message}. The store's user needs SELECT, INSERT, UPDATE and DELETE on the schema's tables (GRANT ... "
            "ON ALL TABLES IN SCHEMA ... TO ...; read-only commands need SELECT only)",
        )
    if state == "42501" and "permission denied for schema" in raw:
        return ServerPermissionError(
            shown,
            f"{message}. The store's user needs USAGE on each judgestore schema and SELECT on its tables to read "
            "(GRANT USAGE ON SCHEMA ... TO ...; GRANT SELECT ON ALL TABLES IN SCHEMA ... TO ...), and INSERT, "
            "UPDATE and DELETE too to write",
        )
    if state == "42501" and raw.startswith("must be owner of"):  # an upgrade altering a table another login made
        return ServerPermissionError(shown, f"{message}. {OWNER_ADVICE}")
    if state == "42501":
        return ServerPermissionError(
            shown,
            f"{message}. The store's user needs CREATE on the database (GRANT CREATE ON DATABASE ... TO ...) to "
            "create schemas, and USAGE/CREATE on the judgestore schemas",
        )
    if state == "25006":
        return ServerPermissionError(
            shown, f"{message}: the server takes no writes (a standby, or default_transaction_read_only); "
            "write to the primary, or open the store read-only"
        )  # fmt: skip
    if state == "57014" and "statement timeout" in raw:  # a limit of the user's or database's, not a contention
        return ServerBusyError(
            shown, f"a statement ran past the server's statement_timeout ({message}) and was cancelled; the "
            "transaction was rolled back. Raise it for the store's user (ALTER ROLE ... SET statement_timeout = ...) "
            "or in the URL (options=-c statement_timeout=0), or ask for fewer databases at once"
        )  # fmt: skip
    if state == "53300" or _NO_SLOT.search(raw):  # at connect, libpq's words and no state
        return ServerUnavailableError(
            shown, f"the server has no connection slot free ({message}). Run fewer jobs at once, open fewer "
            "connections per job (JUDGESTORE_POOL_SIZE=1 JUDGESTORE_POOL_OVERFLOW=0) or put a pooler such as "
            "PgBouncer in front of it, or ask its administrator to raise max_connections (or the role's "
            "CONNECTION LIMIT)"
        )  # fmt: skip
    if state in _BUSY_STATES:
        return ServerBusyError(
            where or shown, f"the transaction was rolled back after {_BUSY_STATES[state]} ({message}), past every "
            "retry; nothing of it was kept. Run the command again (rows already stored are kept)"
        )  # fmt: skip
    if state.startswith("53") and state not in _GONE_STATES:
        return ServerFullError(
            shown, f"the server ran out of a resource ({message}); the transaction was rolled back. Free disk or "
            "memory on the server (its administrator), then run the command again"
        )  # fmt: skip
    if kind == "PipelineAborted":  # psycopg's: an earlier statement of the pipelined batch failed
        return UnexpectedServerError(
            shown, f"a statement of the same batch failed before this one ({message}); the transaction was rolled "
            "back and nothing of it was kept. Run the command again; if it fails the same way, report this message"
        )  # fmt: skip
    if not state and "number of parameters must be between" in raw:  # libpq's limit, the client's refusal
        return ServerValueError(
            shown, f"the statement binds more values than PostgreSQL takes in one statement ({message}); nothing "
            "was sent. Split a long IN (...) list into parts of at most 65,535 values (summing their counts), or "
            "filter with fewer values"
        )  # fmt: skip
    if (
        state.startswith("08")
        or state in _GONE_STATES
        or error.connection_invalidated
        or (not state and isinstance(error, OperationalError | InterfaceError))  # the client lost the connection
    ):
        if state in ("57P01", "57P02") or raw.startswith("terminating connection"):  # it was reached
            return ServerUnavailableError(
                shown, f"the server ended the connection ({message}): it is shutting down or restarting, or an "
                "administrator ended the session; the transaction was rolled back. Run the command again once it "
                "answers"
            )  # fmt: skip
        return ServerUnavailableError(
            shown, f"cannot reach the server ({message}); is it running, and is the URL right?"
        )
    missing = _MISSING_NAME.match(message) if state in _MISSING_STATES else None
    if missing is not None and missing["name"] not in _REGISTRY_NAMES:
        kind = "table" if missing["kind"] == "relation" else "column"
        if (foreign := foreign_name_error(shown, kind, missing["name"], message, _FOREIGN_HINT)) is not None:
            return foreign  # a name of the caller's statement (Store.execute), not a part the schema lost
    if state in _MISSING_STATES:
        return ServerSchemaError(
            shown, f"{message}: a table or column the schema's revision promises is missing (another tool edited "
            "it). Run `judgestore verify`"
        )  # fmt: skip
    if state in _ALTERED_STATES:  # judgestore's statements match the types its schema declares
        return ServerSchemaError(
            shown, f"{message}: a column has another type than the schema's revision declares (another tool "
            "altered it). Run `judgestore verify`"
        )  # fmt: skip
    if state == "22012":  # a statement's own arithmetic (Store.execute), not a value judgestore sent
        return ServerValueError(
            shown, f"the statement divides by zero ({message}): PostgreSQL refuses it where SQLite gives NULL; "
            "divide by nullif(x, 0) to get NULL on both"
        )  # fmt: skip
    if not state and isinstance(error, DataError) and _UNLOADABLE.search(raw):  # psycopg's, reading a row
        return DamagedValueError.read(shown, f"{kind}: {message}")
    if state.startswith(("22", "23", "54")) or isinstance(error, DataError | IntegrityError):
        return ServerValueError(
            shown, f"the server refused a value ({kind}: {message}); nothing of the statement was kept. judgestore "
            "checks the values it writes before it sends them: if the statement is your own (Store.execute, a "
            "session), a value of it is the cause (PostgreSQL's text holds no U+0000); else please report "
            "this value"
        )  # fmt: skip
    if state.startswith(("XX", "58")):
        return ServerDamagedError(
            shown, f"the server reports damaged data or a failing disk ({message}); ask its administrator to check "
            "it (REINDEX, amcheck, its logs), then run `judgestore verify`"
        )  # fmt: skip
    return UnexpectedServerError(
        shown, f"PostgreSQL failed in a way judgestore has no name for ({kind}: {message}); the transaction was "
        "rolled back and nothing of it was kept. Run the command again; if it fails the same way, report this message"
    )  # fmt: skip


def raise_translated(url: str, error: DBAPIError, *, where: str | None = None) -> NoReturn:
    raise translated(url, error, where=where) from error


def pool_exhausted(url: str, pool_size: int, pool_overflow: int, error: Exception) -> ServerBusyError:
    """SQLAlchemy's ``TimeoutError`` of a pool whose every connection stayed in use past its wait, typed: in this
    process, not the server (which ``pg_stat_activity`` would show idle)."""
    return ServerBusyError(
        display_url(url),
        f"every connection this process may open to the server ({pool_size} kept, {pool_overflow} more at a burst) "
        f"was in use and none came back in time ({error.__class__.__name__}: {str(error).splitlines()[0]}). "
        "Each result of Store.scalars or Store.execute not read to its end holds one: read it whole (list(...)) or "
        "close it before the next query; or raise JUDGESTORE_POOL_SIZE",
    )
