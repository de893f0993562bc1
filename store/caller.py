"""Warnings that point at the code that called judgestore, not at judgestore's own lines.

A fixed ``stacklevel`` is right for one call path only: the same warning is raised through ``Store()``, a
``CachedModel``, the command line or a validator, at different depths, and pointed one frame short or long on all
but one of them (a warning's location is what a user reads first, and what a ``filterwarnings`` rule matches).
"""

from __future__ import annotations

import sys
import warnings

# Frames of these packages are skipped: judgestore's own, pydantic's, whose validators call ours, and the standard
# library's (a ``functools.cached_property`` between the user's line and ours)
_SKIPPED = frozenset({"store", "inference", "pydantic", "pydantic_core", "pydantic_settings"}) | sys.stdlib_module_names


def _skipped(module: str) -> bool:
    return module.partition(".")[0] in _SKIPPED


def warn_the_caller(message: str, category: type[Warning]) -> None:
    """Issue ``message`` as ``category``, located at the innermost frame outside the :data:`_SKIPPED` packages (the
    outermost of judgestore's frames when there is none, as under ``python -m store``)."""
    frame = sys._getframe(1)
    level = 2  # stacklevel 2 is this function's caller, ``frame``
    while frame.f_back is not None and _skipped(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
