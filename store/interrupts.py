"""What a long operation had done when Ctrl-C stopped it, carried on the ``KeyboardInterrupt`` to the command line.

Contract:

* :func:`carrying` wraps the work of an operation that fills a report as it
  goes (a copy, a push, a fetch, an import): a ``KeyboardInterrupt`` that
  passes through it gets that report as an attribute of the given name, and
  is raised again. The command reads it back (``getattr(error, name, None)``)
  and says what was done (:func:`store.cli.common.interrupted`).
* ``db upgrade``: a ``KeyboardInterrupt`` raised while a database is being
  migrated carries its ``where`` as :data:`MIGRATING`; the command then
  reads whether the migration's commit had finished. One raised anywhere
  else (a database that was already current) carries nothing.
* What a report counts must be committed: an operation counts a write once it
  stands, including when Ctrl-C came during its commit (SQLite finishes the
  commit, and Python raises the interrupt just after it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

MIGRATING = "migrating"


@contextmanager
def carrying(name: str, report: object) -> Iterator[None]:
    """Attach ``report`` to a ``KeyboardInterrupt`` raised inside, as attribute ``name``; raise it again."""
    try:
        yield
    except KeyboardInterrupt as e:
        setattr(e, name, report)
        raise
