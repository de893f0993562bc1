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
    known = list(names)
    spelt = name.lower().replace("-", "_")
    if spelt != name and spelt in known:
        return spelt
    close = difflib.get_close_matches(spelt, known, n=1, cutoff=cutoff)
    return close[0] if close else None
