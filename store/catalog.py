"""A store's catalog: what each database held when it was last read, believed only while its stamp is unchanged.

Contract:

* A cache of this machine, never part of the store: one JSON file per store
  under ``$XDG_CACHE_HOME/judgestore`` (default ``~/.cache``), whose place the
  backend chooses. Nothing in the store is written, so read-only commands may
  refresh it; deleting it costs one slower listing; a store copied elsewhere
  starts without one.
* Per database (a key the backend chooses: its path under a folder store's
  root, a server schema's name) the catalog keeps the database's *stamp* and
  what was derived from the database at that stamp (its state and rows, the
  distinct values of the filter columns, its statistics), and the head
  revision of the library that derived it. An entry is used only while the
  stamp read now equals the one recorded and the library's head is the same;
  any difference and the database is read again, so a stale entry is never
  believed (a library with a newer revision finds the database behind, and
  says so, however an older one catalogued it). A backend that cannot stamp
  a database (None) never has its values kept.
* The stamp is read *before* the database is: a write during the read leaves
  the older stamp, and the next command reads the database again.
* What changes with the clock alone is never kept: a value ``lasting``
  refuses (a database's state while its claims hold live leases: a lease
  that passes its deadline is stale, with no write) is read by every command.
* Writing is best effort and atomic (a temporary file renamed over): a
  catalog that cannot be written (a read-only home, a full disk) means the
  next command reads the databases again; one that cannot be parsed, or was
  written by another version, is ignored.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from store import schema

# v2: totals leave out seconds no call takes; a v1 entry may hold null for the inf they summed to (stats crashed on
# it), so every v1 catalog is read anew once
CATALOG_FORMAT = "judgestore-catalog/v2"
# What a value derived from a database that could not be read holds instead (its error): never kept (:func:`readable`)
UNREADABLE = "$judgestore-error"


def readable(value: dict[str, Any]) -> bool:
    """Whether a catalog may keep ``value``: not what a database that could not be read gave (read it again)."""
    return UNREADABLE not in value


def cache_home() -> Path:
    """Where this machine keeps judgestore's caches: ``$XDG_CACHE_HOME/judgestore`` (default ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "judgestore"


def _head() -> str:
    # Read at each use, not once: what a database's bytes say (behind or current, and so its values and its
    # statistics) depends on the revisions the library knows, and tests swap those within one process.
    return schema.revisions().head


def _current(entry: dict[str, Any], now: Any) -> bool:
    """Whether ``entry`` was derived at the stamp ``now`` by a library of this head revision."""
    return entry.get("stamp") == now and entry.get("head") == _head()


class Catalog:
    """The catalog kept at ``path`` for the store ``owner`` names (see the module docstring); ``save`` writes what
    changed."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        self._entries: dict[str, dict[str, Any]] = {}
        self._dirty = False
        try:
            doc = orjson.loads(self.path.read_bytes())
            if type(doc) is dict and doc.get("format") == CATALOG_FORMAT and type(doc.get("entries")) is dict:
                # an entry that is no object is damage, ignored as the rest of a damaged catalog is (it crashed: was)
                self._entries = {key: entry for key, entry in doc["entries"].items() if type(entry) is dict}
        except (OSError, ValueError):
            pass  # none yet, unreadable or damaged: it is rebuilt from the databases

    def remembered(
        self, key: str, now: Any, kind: str, compute: Callable[[], Any], *, lasting: Callable[[Any], bool] | None = None
    ) -> Any:
        """``compute()`` (a JSON value derived from the database ``key``), or what it gave when the database's stamp
        was ``now`` (read by the caller before this call; None: not stampable, never kept); a value ``lasting``
        refuses (one the clock alone changes) is given back but not kept."""
        known = self.known(key, now, kind)
        if known is not None:
            return known[0]
        return self.keep(key, now, kind, compute(), lasting=lasting)

    def known(self, key: str, now: Any, kind: str) -> tuple[Any] | None:
        """``(value,)`` when ``kind`` of ``key`` was kept at the stamp ``now`` by a library of this head revision;
        None when it must be computed."""
        entry = self._entries.get(key)
        if now is not None and entry is not None and _current(entry, now) and kind in entry:
            return (entry[kind],)
        return None

    def keep(self, key: str, now: Any, kind: str, value: Any, *, lasting: Callable[[Any], bool] | None = None) -> Any:
        """Keep ``value`` as ``kind`` of ``key`` at the stamp ``now`` (unless None, or ``lasting`` refuses it);
        returns it as it reads back from the catalog, kept or not."""
        try:
            value = orjson.loads(orjson.dumps(value))
        except orjson.JSONEncodeError:  # text that is not valid Unicode (a path of bytes that are not UTF-8)
            try:
                return json.loads(json.dumps(value))  # as it would read back, and not kept: the catalog cannot hold it
            except (TypeError, ValueError):  # a BLOB another tool stored in a text column: every filter crashed (was)
                return value
        if now is None or (lasting is not None and not lasting(value)):
            return value
        entry = self._entries.get(key)
        if entry is None or not _current(entry, now):
            entry = self._entries[key] = {"stamp": now, "head": _head()}
        entry[kind] = value
        self._dirty = True
        return value

    def keep_only(self, keys: Iterable[str]) -> None:
        """Drop the entries of databases no longer in the store (``keys``: every one there is)."""
        present = set(keys)
        gone = [key for key in self._entries if key not in present]
        for key in gone:
            del self._entries[key]
        self._dirty = self._dirty or bool(gone)

    def save(self) -> None:
        """Write the catalog if anything changed (atomically; silently not at all where it cannot be written)."""
        if not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".catalog.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(orjson.dumps({"format": CATALOG_FORMAT, "store": self.owner, "entries": self._entries}))
                os.replace(temp, self.path)
            except BaseException:
                Path(temp).unlink(missing_ok=True)
                raise
        except (OSError, orjson.JSONEncodeError):  # not writable here, or a root whose name is not valid Unicode
            return  # a cache: the next command reads the databases again
        self._dirty = False
