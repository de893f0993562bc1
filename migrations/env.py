"""Alembic environment for developers' `alembic` commands.

judgestore itself never runs this file: :mod:`store.schema` drives the same
revision scripts programmatically, with the same options
(:data:`store.schema.MIGRATION_OPTIONS`), on a connection it already holds.
Here the database is the one named by ``JUDGESTORE_ALEMBIC_DB`` (default
``judgestore-dev.db`` in the system's temporary folder, so that a command run
in a clone leaves nothing in it), or a connection passed in
``config.attributes``.
"""

from __future__ import annotations

import os
import tempfile

from alembic import context
from sqlalchemy import create_engine

from store.schema import MIGRATION_OPTIONS


def _run(connection: object) -> None:
    context.configure(connection=connection, **MIGRATION_OPTIONS)  # type: ignore[arg-type]
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url="sqlite://", literal_binds=True, **MIGRATION_OPTIONS)  # type: ignore[arg-type]
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = context.config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    default = os.path.join(tempfile.gettempdir(), "judgestore-dev.db")
    url = "sqlite:///" + os.environ.get("JUDGESTORE_ALEMBIC_DB", default)
    with create_engine(url).connect() as connection:
        _run(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
