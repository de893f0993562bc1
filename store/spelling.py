"""Misspelt names: which known name a given one was most likely meant to be.

Contract: :func:`meant` returns the one of ``names`` that ``name`` is spelt
almost like (``difflib``'s ratio at least ``cutoff``, case and ``-`` for
``_`` aside), or None. Callers use it to suggest a name in a refusal
(``did you mean``), or to warn of a name that is passed on unread where a
misspelling would be lost silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def meant(name: str, names: Iterable[str], *, cutoff: float = 0.85) -> str | None:
    """The known name ``name`` is most likely a misspelling of, or None (see the module docstring)."""
    by_spelling: dict[str, str] = {}  # both sides spelt alike: RUN-2 for a known run-2 (was: only the given one)
    for known in names:
        by_spelling.setdefault(_spelling(known), known)
    spelt = _spelling(name)
    if by_spelling.get(spelt, name) != name:
        return by_spelling[spelt]
    close = difflib.get_close_matches(spelt, list(by_spelling), n=1, cutoff=cutoff)
    return by_spelling[close[0]] if close else None


def _spelling(name: str) -> str:
    return name.lower().replace("-", "_")
