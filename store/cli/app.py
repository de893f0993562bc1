"""The ``judgestore`` command line, assembled in one place.

Contract:

* :func:`build_app` builds the one typer app: the store's commands (``ls``,
  ``query``, ``delete``, ``db status``, ``db upgrade``, ``verify``, ``stats``,
  ``prune``, ``vacuum``, ``export``, ``hub push``, ``hub fetch``, ``copy``, ``browse``), then the
  commands of each registrar it is given.
  Each CLI module exposes ``register(app)``; nothing mutates a global app at
  import time and no CLI module imports another.
* ``python -m store`` (:func:`main`) runs the store's commands alone, without
  the inference layer's imports; the ``judgestore`` console script
  (:func:`inference.cli.main`) runs the same app with the inference layer's
  commands added (``generate``, ``judge``, ``pairs``, ``import``).
* The edge (errors, output) is :mod:`store.cli.common`; the shared option groups are :mod:`store.cli.options`;
  tables are :mod:`store.cli.tables` and ``--help`` is :mod:`store.cli.help`, both made to fit 80 columns.
* A command module imports what only its commands use (sharing, the legacy
  readers, stats, prune, vacuum, export, explain, audit) inside them: starting
  a command imports its own path, and a run that is all hits is nothing but
  its start (see the README's Performance section).
* The modules that declare commands or option groups do not use
  ``from __future__ import annotations``: typer reads every command's
  annotations when the app starts, and string annotations would be compiled
  and evaluated there, about 500 of them at every start (tests/test_cli_start.py
  checks this). A type only imported under ``TYPE_CHECKING`` is quoted instead.
"""

from collections.abc import Callable

import typer

from store.cli import browse, cache, data, db, hub, transfer
from store.cli.help import plain_help

Registrar = Callable[[typer.Typer], None]
STORE_COMMANDS: tuple[Registrar, ...] = (
    data.register,
    db.register,
    cache.register,
    hub.register,
    transfer.register,
    browse.register,
)


def build_app(*registrars: Registrar) -> typer.Typer:
    """The ``judgestore`` app: the store's commands, then each registrar's."""
    app = typer.Typer(
        name="judgestore",
        help="A content-addressed store of LLM completions and judgements.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
    )
    for register in (*STORE_COMMANDS, *registrars):
        register(app)
    plain_help(app)  # help that reads whole at 80 columns (store.cli.help)
    return app


def main() -> None:
    """``python -m store``: the store's commands."""
    build_app()(prog_name="judgestore")
