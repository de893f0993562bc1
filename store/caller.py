"""Warnings that point at the code that called judgestore, not at judgestore's own lines.

A fixed ``stacklevel`` is right for one call path only: the same warning is raised through ``Store()``, a
``CachedModel``, the command line, a validator or a LangChain call, at different depths, and pointed one frame short
or long on all but one of them (a warning's location is what a user reads first, and what a ``filterwarnings`` rule
matches).
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType

# Frames passed over on the way out: judgestore's own, pydantic's (whose validators call ours) and LangChain's (whose
# runnables call our chat model); the standard library's are passed over too (a ``functools.cached_property``, a
# thread pool's worker), but never taken for judgestore's outermost frame.
_OURS = frozenset({"store", "inference", "pydantic", "pydantic_core", "pydantic_settings", "langchain_core"})


def _package(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", "")).partition(".")[0]


def warn_the_caller(message: str, category: type[Warning]) -> None:
    """Issue ``message`` as ``category``, located at the innermost frame that is neither judgestore's (or one of the
    frameworks that call it) nor the standard library's: the user's line. On a thread of judgestore's own (an async
    call's worker), which no user frame starts, it is located at the outermost of judgestore's frames."""
    frame: FrameType | None = sys._getframe(1)
    level = 2  # stacklevel 2 is this function's caller, ``frame``
    outermost_ours = level
    while frame is not None:
        package = _package(frame)
        if package in _OURS:
            outermost_ours = level
        elif package not in sys.stdlib_module_names:
            break  # the caller's
        frame, level = frame.f_back, level + 1
    else:
        level = outermost_ours
    warnings.warn(message, category, stacklevel=level)
