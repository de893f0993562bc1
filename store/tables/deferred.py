"""Deferred columns: a lookup leaves out what a cache hit never returns, and a record reads it on first access.

Contract:

* The columns the models mark ``info={"deferred": True}`` (:data:`DEFERRED_COLUMNS`:
  ``input_text``, 2-8 KB a row, and the row's bookkeeping: benchmark,
  instruction id, run id, author, creation time) are left out of the bulk
  lookup (:meth:`~store.backend.Database.get_many`), which selects the key,
  sample, answer, finish reason, usage, logprobs, model labels and adoption;
  each record it builds holds a :class:`DeferredColumns` shared by the whole
  lookup instead.
* The first access to any deferred column of any record of that lookup reads
  the whole rows of every record the lookup found, in one statement
  (``load``), and fills every deferred column of the record touched (the
  others are filled from the same rows when touched), so touching every
  record costs one more query, never one per record. The record is then the
  same as one read whole: equal to it, the same class, the same
  ``asdict``/pickle/repr (each reads the fields, which loads them).
* Safe after the lookup's transaction has ended: a row's key is the hash of
  its ``input_text`` (and sample), so any row stored under that key holds
  the same text; its bookkeeping is what the row holds when it is read. A
  row deleted in between raises :class:`~store.errors.RowGoneError` naming
  it; the next lookup will not find it either.
* :class:`Deferrable` is the record classes' base (``store.tables.records`` is
  generated so): one slot for the batch and a ``__getattr__`` that Python
  calls only when a slot is unset, so a record read whole pays nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from store.errors import RowGoneError

# What store.tables.models marks deferred, in column order (a test holds them equal).
DEFERRED_COLUMNS = ("benchmark", "instruction_id", "run_id", "created_by", "created_at", "input_text")

C = TypeVar("C")
WholeRecordLoader = Callable[[Sequence[str]], dict[str, Any]]  # keys -> the whole records stored under them


def looked_up(columns: Sequence[C], lean: bool) -> tuple[C, ...]:
    """``columns`` as a lookup selects them: without the deferred ones when ``lean``."""
    return tuple(c for c in columns if not (lean and c.key in DEFERRED_COLUMNS))  # type: ignore[attr-defined]


class DeferredColumns:
    """What one lookup left out: read for all its rows on the first access to any (see the module docstring)."""

    __slots__ = ("_load", "_lock", "_values", "keys", "where")

    def __init__(self, load: WholeRecordLoader, where: str) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._values: dict[str, Any] | None = None
        self.keys: Sequence[str] = ()  # set once the lookup knows what it found
        self.where = where

    def whole(self, key: str) -> Any:
        """The whole record stored under ``key``, read with every other record of the lookup on the first call."""
        values = self._values
        if values is None:
            with self._lock:
                values = self._values
                if values is None:
                    values = self._values = self._load(self.keys)
                    self.keys = ()
        try:
            return values[key]
        except KeyError:
            raise RowGoneError(
                self.where,
                f"row {key[:16]} was deleted after it was looked up: its {', '.join(DEFERRED_COLUMNS)} cannot be "
                "read (look the key up again)",
            ) from None


class Deferrable:
    """The base of the row records: one slot holding the lookup's :class:`DeferredColumns`, if any."""

    __slots__ = ("_deferred",)

    def __getattr__(self, name: str) -> Any:
        # Only reached when ordinary lookup failed: here, a slot left unset by a lookup that deferred it.
        if name in DEFERRED_COLUMNS:
            try:
                deferred: DeferredColumns = _deferred_slot.__get__(self, type(self))
            except AttributeError:
                pass
            else:
                whole = deferred.whole(object.__getattribute__(self, "input_hash"))
                kind = type(self)
                for column in DEFERRED_COLUMNS:  # every deferred slot at once: the record is then whole
                    getattr(kind, column).__set__(self, getattr(whole, column))  # the slots' own setters: frozen
                _deferred_slot.__delete__(self)  # the batch is released with the last record still holding it
                return getattr(whole, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def is_deferred(self, name: str) -> bool:
        """Whether ``name`` is still to be read (a lookup left it out and nothing has read it since)."""
        try:
            getattr(type(self), name).__get__(self, type(self))
        except AttributeError:
            return True
        return False


_deferred_slot: Any = vars(Deferrable)["_deferred"]
set_deferred: Callable[[Any, DeferredColumns], None] = _deferred_slot.__set__
