"""Ctrl-C in the middle of a command, where the test chooses: a ``KeyboardInterrupt`` raised by a step the
command takes many times (a row turned into output, a database verified), on that step's nth call."""

from __future__ import annotations

from typing import Any

import pytest

from store.rows import FoundRow

# A read the interrupt left open, closed by the garbage collector after its store: "Exception ignored" on stderr
NO_READ_LEFT_OPEN = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")


def ctrl_c_on_call(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str, nth: int, *, after: bool = False
) -> list[Any]:
    """Make ``owner.name`` raise ``KeyboardInterrupt`` on its ``nth`` call: before it runs, or ``after`` it ran
    (what it did stays done, as when Ctrl-C lands just after a step). Returns the first argument of every call."""
    real = getattr(owner, name)
    calls: list[Any] = []

    def step_then_ctrl_c(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0] if args else None)
        if len(calls) == nth and not after:
            raise KeyboardInterrupt
        result = real(*args, **kwargs)
        if len(calls) == nth:
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(owner, name, step_then_ctrl_c)
    return calls


def ctrl_c_at_row(monkeypatch: pytest.MonkeyPatch, nth: int) -> list[Any]:
    """Ctrl-C while the ``nth`` row found is turned into output (the rows before it are written whole)."""
    return ctrl_c_on_call(monkeypatch, FoundRow, "as_dict", nth)
