"""The root of judgestore's one exception hierarchy, and how a message says to upgrade or install.

Contract: :class:`JudgestoreError` is the base of every error judgestore
raises on purpose (each family lives in a sibling module, and every name is
imported from :mod:`store.errors`). :data:`UPGRADE_HOW` and
:func:`install_hint` are the one wording of "upgrade judgestore" and
"install this optional package" for an install from a clone or a wheel.
"""

from __future__ import annotations

__all__ = [
    "UPGRADE_HOW",
    "UPGRADE_JUDGESTORE",
    "JudgestoreError",
    "MissingDependencyError",
    "install_hint",
]


# judgestore is installed from its clone or from a wheel built there, not from the package index: a message
# that asks for an upgrade or an optional package says how it is done for such an install.
UPGRADE_HOW = "in its clone: `git pull && pip install -e .`; or install a newer wheel"
UPGRADE_JUDGESTORE = f"upgrade judgestore ({UPGRADE_HOW})"


def install_hint(extra: str, packages: str) -> str:
    """How to install what an optional feature needs: the packages, or judgestore's extra from its clone."""
    return f"`pip install {packages}` (judgestore's {extra} extra: `pip install -e '.[{extra}]'` in its clone)"


class JudgestoreError(Exception):
    """Base class of every error judgestore raises on purpose.

    ``rows_kept`` is set by a command that stored rows before it failed (a
    run that met a full disk): they are intact, and a rerun does not compute
    them again. ``rows_deleted`` is set by a delete that had deleted rows
    from some databases before it failed on another (each database is one
    transaction): those are gone, the others untouched. Notes added with
    :meth:`add_note` are part of the message the command line prints.
    """

    rows_kept: int | None = None
    rows_deleted: int | None = None


class MissingDependencyError(JudgestoreError):
    """An optional package a feature needs is not installed; the message names what to install."""
