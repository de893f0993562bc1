"""Reaching a PostgreSQL server: store URLs (read as the server is asked, printed without a password) and the engine.

Contract:

* :func:`parse_store_url` reads a store URL as the server will be asked (a
  password may hold an unencoded ``@``); :func:`display_url` prints it
  without any password, whether in the user part or a query parameter, and
  :func:`_without_secrets` removes one a driver message quotes.
* :func:`create_postgres_engine` is one pooled engine for every schema of the
  server's database (``pool_size``/``pool_overflow``, ``pool_pre_ping``, the
  connect timeout, prepared statements off behind a PgBouncer that cannot
  keep them; a connection parameter the URL gives wins over these), with
  the JSON serializer that escapes U+0000
  (:mod:`store.backends.postgres.text`).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, unquote

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from store.backends.postgres import text as pgtext
from store.errors import InvalidInputError, install_hint
from store.settings import Settings


def parse_store_url(url: str) -> URL:
    """A store URL parsed as the server will be asked: a password may hold an unencoded ``@``.

    SQLAlchemy's parser ends the password at its first ``@``, so
    ``eval:p@ss@host/db`` would mean the password ``p`` on the host
    ``ss@host`` (and the message about that host would print the password's
    tail). Here the user part ends at the last ``@`` before the path (or
    before the query, when the part before its ``?`` holds an ``@``), as
    browsers and :mod:`urllib` read it; the user and the password are
    percent-encoded again before SQLAlchemy parses the URL.
    """
    scheme, separator, rest = url.partition("://")
    head, slash, path = rest.partition("/")
    tail = slash + path
    before, question, after = head.partition("?")
    if question and "@" in before:  # no path, and a query that may hold an @ (?password=p@ss) follows the host
        head, tail = before, question + after + tail
    if separator and "@" in head:
        user_part, _, host = head.rpartition("@")
        user, colon, password = user_part.partition(":")
        encoded = quote(unquote(user), safe="") + (colon + quote(unquote(password), safe="") if colon else "")
        path, question, query = tail.partition("?")
        # An @ left in the query would make SQLAlchemy's user part run on to it; the query is unquoted again.
        url = f"{scheme}://{encoded}@{host}{path}{question}{query.replace('@', '%40')}"
    return make_url(url)


def _is_secret(name: str) -> bool:
    return "password" in name.lower()  # password, sslpassword: libpq's parameters that hold a secret


def _without_secrets(message: str, url: str) -> str:
    """``message`` with every password the URL holds replaced by ``***`` (a driver may quote a URL's parts)."""
    try:
        parsed = parse_store_url(url)
    except (ArgumentError, ValueError):
        return message
    secrets = [parsed.password, *(v for k, v in parsed.query.items() if _is_secret(k))]
    for secret in secrets:
        for value in secret if isinstance(secret, tuple) else (secret,):
            if value:
                message = message.replace(str(value), "***")
    return message


POSTGRES_DRIVERS = ("postgresql", "postgresql+psycopg")
MAX_PORT = 65_535


def is_store_url(value: str) -> bool:
    return value.split("://", 1)[0] in POSTGRES_DRIVERS


def display_url(url: str) -> str:
    """The URL as it may be printed: never with its password, whether in the user part or a query parameter."""
    try:
        parsed = parse_store_url(url)
    except (ArgumentError, ValueError):
        return "<an invalid store URL>"
    hidden = {k: "***" for k in parsed.query if _is_secret(k)}
    shown = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    return shown.replace("=%2A%2A%2A", "=***")  # as the user part's password is shown


def checked_store_url(url: str) -> URL:
    """``url`` parsed; InvalidInputError (never naming its password) if it is not a PostgreSQL store's URL."""
    try:
        parsed = parse_store_url(url)
    except (ArgumentError, ValueError) as e:
        raise InvalidInputError(
            f"{display_url(url)} is not a store URL ({e}); expected postgresql+psycopg://..."
        ) from e
    if parsed.drivername not in POSTGRES_DRIVERS:
        raise InvalidInputError(f"store URL driver {parsed.drivername!r} is not supported; use postgresql+psycopg")
    if parsed.port is not None and not 1 <= parsed.port <= MAX_PORT:  # found only on connecting, as exit 1 (was)
        raise InvalidInputError(
            f"{display_url(url)} is not a store URL (port {parsed.port} is not a TCP port, 1-{MAX_PORT})"
        )
    return parsed


def _connect_defaults(parsed: URL, settings: Settings) -> dict[str, Any]:
    """The driver's connection parameters judgestore sets, less those the URL gives itself (``?connect_timeout=2``,
    ``?application_name=job-17``: the connection string is the user's word) and, for the application name,
    libpq's ``PGAPPNAME``, which a cluster's job scripts may set to tell jobs apart in ``pg_stat_activity``."""
    defaults: dict[str, Any] = {"connect_timeout": settings.connect_timeout_s}
    if not os.environ.get("PGAPPNAME"):
        defaults["application_name"] = "judgestore"
    if not settings.prepared_statements:
        defaults["prepare_threshold"] = None
    return {name: value for name, value in defaults.items() if name not in parsed.query}


def create_postgres_engine(url: str, settings: Settings) -> Engine:
    """One pooled engine for every schema of the server's database (see the module docstring)."""
    parsed = checked_store_url(url)
    try:
        return create_engine(
            parsed.set(drivername="postgresql+psycopg"),
            pool_size=settings.pool_size,
            max_overflow=settings.pool_overflow,
            pool_pre_ping=True,  # a connection the server dropped is replaced, not handed out
            connect_args=_connect_defaults(parsed, settings),
            json_serializer=pgtext.dumps_json,
            json_deserializer=pgtext.loads_json,
        )
    except (NoSuchModuleError, ModuleNotFoundError) as e:
        raise InvalidInputError(
            "a PostgreSQL store needs the psycopg driver: " + install_hint("postgresql", "'psycopg[binary]>=3.2'")
        ) from e
    except ArgumentError as e:  # SQLAlchemy's reading of the query string (a port that is not a number)
        raise InvalidInputError(f"{display_url(url)}: the URL gives a connection option a value it refuses ({e}); "
                                "fix the URL") from e  # fmt: skip
