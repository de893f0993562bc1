"""Reading legacy files without changing a byte of them: SQLite files, CSV zips, parquet files.

Contract:

* :func:`open_sqlite_readonly` never writes to the source or its folder. A file
  with no pending journal is opened ``mode=ro&immutable=1`` (no lock, no
  ``-shm``, no ``-wal`` created). A file whose ``-wal`` or ``-journal`` holds
  data (its writer crashed or is still running) cannot be read that way:
  ``immutable`` ignores the WAL (rows would be missing) and a read-only
  connection would need to create ``-shm`` beside the source. Such a file is
  copied, with its journal, into a private temporary folder and the copy is
  read; the copy is deleted afterwards. Do not import from a cache that a
  process is still writing: the copy is a snapshot of whatever was on disk.
* An ``immutable`` read takes no lock, so it never makes a writer of the
  file wait, and a writer's commit during it is not seen as one: pages of
  two states may be read. :func:`file_stamp` (size, modification time,
  SQLite's file change counter, the journals beside it) taken before and
  after a read says whether the file was written meanwhile, so that such a
  read is reported as what it is, not as a damaged file or a silent count.
* Text comes back as ``bytes`` (``text_factory=bytes``) so that a value which is
  not UTF-8 fails one row with a clear reason instead of the whole cursor.
* :func:`open_dataframe` reads the pass-level DataFrame caches: a zip holding
  one CSV (what ``pandas.DataFrame.to_csv("x.csv.zip")`` writes), a plain CSV,
  or a parquet file (needs ``pyarrow``; without it the file is reported, not
  guessed). Empty CSV cells and parquet nulls are ``None``.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import sqlite3
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from store.errors import DataFrameError

SQLITE_MAGIC = b"SQLite format 3\x00"
ZIP_MAGIC = b"PK\x03\x04"
PARQUET_MAGIC = b"PAR1"
_JOURNALS = ("-wal", "-journal")
_CSV_FIELD_LIMIT = 1 << 30  # legacy completions can be long; the csv default (128 KiB) is far too small


def file_kind(path: Path) -> str:
    """``sqlite``, ``zip``, ``parquet``, ``csv`` (by extension, for plain text) or ``other``, by content first."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        return "other"
    if head == SQLITE_MAGIC:
        return "sqlite"
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if path.name.endswith(".csv"):
        return "csv"
    return "other"


def pending_journal(path: Path) -> list[Path]:
    """The journal files beside ``path`` that hold data SQLite would still have to apply."""
    found = []
    for suffix in _JOURNALS:
        journal = Path(f"{path}{suffix}")
        try:
            if journal.stat().st_size > 0:
                found.append(journal)
        except OSError:
            continue
    return found


def file_stamp(path: Path) -> tuple[object, ...]:
    """What changes when a process writes ``path``: its size and modification time, SQLite's file change counter
    (header bytes 24-27, one more at each commit of a rollback-journal database), and its journals' sizes (a
    missing one as an empty one: what a reader leaves is no write)."""
    try:
        stat = path.stat()
        with path.open("rb") as f:
            header = f.read(28)
    except OSError as e:
        return ("unreadable", str(e))
    journals = []
    for suffix in _JOURNALS:
        try:
            journals.append(Path(f"{path}{suffix}").stat().st_size)
        except OSError:  # none is as an empty one: another process's reader creates an empty -wal, and leaves it
            journals.append(0)
    return stat.st_size, stat.st_mtime_ns, header[24:28], *journals


WRITTEN_MEANWHILE = (
    "was written by another process while it was read (a run still writing this cache?): what was read may mix "
    "two states of it; import it again once its writer has finished"
)


@contextmanager
def open_sqlite_readonly(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection that reads ``path`` (see the module docstring for how nothing is written)."""
    journals = pending_journal(path)
    with tempfile.TemporaryDirectory(prefix="judgestore-legacy-") if journals else _no_folder() as scratch:
        if scratch is None:
            uri = f"file:{quote(os.fsencode(path.resolve()))}?mode=ro&immutable=1"
        else:
            copy = Path(scratch) / path.name
            shutil.copyfile(path, copy)
            for journal in journals:
                shutil.copyfile(journal, Path(f"{copy}{journal.name[len(path.name) :]}"))
            # Read-write on the private copy: SQLite applies the WAL (or rolls back a hot journal) there.
            uri = f"file:{quote(os.fsencode(copy))}?mode=rw"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.text_factory = bytes
        try:
            yield conn
        finally:
            conn.close()


@contextmanager
def _no_folder() -> Iterator[None]:
    yield None


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    notnull: bool


def table_columns(conn: sqlite3.Connection) -> dict[str, tuple[ColumnInfo, ...]]:
    """Every user table (``sqlite_*`` tables left out) and its columns, in declaration order."""
    tables = [
        as_text(row[0])
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    ]
    result = {}
    for table in sorted(tables):
        rows = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
        result[table] = tuple(ColumnInfo(as_text(r[1]), bool(r[3])) for r in rows)
    return result


def as_text(value: Any) -> str:
    """A value read with ``text_factory=bytes`` as text (bytes that are not UTF-8 replaced: for names in messages)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------- DataFrame caches


@dataclass(frozen=True, slots=True)
class DataFrameSource:
    """A DataFrame cache opened for reading: its columns and a way to stream its rows."""

    path: Path
    fmt: str  # csv.zip | csv | parquet
    columns: tuple[str, ...]
    rows: int | None

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """The rows, as the file gives them; damage found past the header (a byte that is not UTF-8, a zip member
        that fails its CRC, a parquet row group that cannot be read) raises :class:`DataFrameError` there."""
        if self.fmt == "parquet":
            try:
                yield from _parquet_rows(self.path)
            except DataFrameError:
                raise
            except Exception as e:  # pyarrow raises its own error types for every kind of damage
                raise DataFrameError(f"is not a readable parquet file ({e})") from e
            return
        if self.fmt == "csv":  # a zip member's end is checked by its CRC; a plain file's only by its last byte
            _check_csv_end(self.path)
        with _csv_damage(), _csv_text(self.path) as handle:
            # strict: a quoted field the file ends inside is damage, not a shorter value (the default)
            reader = csv.reader(handle, strict=True)
            header = next(reader, [])
            for fields in reader:
                if not fields:
                    continue  # a blank line
                if len(fields) != len(header):  # a row cut short, or mangled: never padded with NULLs
                    raise DataFrameError(
                        f"line {reader.line_num} has {len(fields)} fields where the header has {len(header)}: "
                        "the file is damaged or cut short"
                    )
                yield {name: (value if value != "" else None) for name, value in zip(header, fields, strict=True)}


def _check_csv_end(path: Path) -> None:
    """DataFrameError unless a plain CSV file ends with a line break, as every CSV writer (pandas', the csv
    module's) ends each row: a file cut short in its last row (a copy or a disk that filled) would otherwise give a
    shorter answer, or a number cut into another (``2999`` into ``29``), as a whole row."""
    with path.open("rb") as raw:
        raw.seek(0, os.SEEK_END)
        if raw.tell() == 0:
            return  # no header: said by the header's check
        raw.seek(-1, os.SEEK_END)
        if raw.read(1) not in (b"\n", b"\r"):
            raise DataFrameError(
                "does not end with a line break, as a CSV writer ends every row: it was cut short (if the file is "
                "whole, written by hand, add a line break at its end)"
            )


@contextmanager
def _csv_text(path: Path) -> Iterator[io.TextIOWrapper]:
    csv.field_size_limit(_CSV_FIELD_LIMIT)
    if file_kind(path) == "zip":
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise DataFrameError(f"is not a readable zip archive ({e})") from e
        with archive:
            members = [m for m in archive.namelist() if not m.endswith("/")]
            if len(members) != 1 or not members[0].endswith(".csv"):
                raise DataFrameError(f"holds {members} where a CSV cache holds exactly one .csv file")
            with archive.open(members[0]) as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as handle:
                yield handle
        return
    with path.open("r", encoding="utf-8-sig", newline="") as handle:  # -sig: Excel's byte order mark is no name
        yield handle


@contextmanager
def _csv_damage() -> Iterator[None]:
    """What reading a CSV, or the CSV a zip holds, raises on damaged bytes, as :class:`DataFrameError`."""
    try:
        yield
    except UnicodeDecodeError as e:
        raise DataFrameError(f"is not UTF-8 text ({e})") from e
    except csv.Error as e:
        raise DataFrameError(f"is not a CSV file ({e})") from e
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # a member whose data fails its CRC or inflation
        raise DataFrameError(f"is not a readable zip archive ({e})") from e


def _csv_header(path: Path) -> tuple[str, ...]:
    with _csv_damage(), _csv_text(path) as handle:
        header = next(csv.reader(handle), None)
    if not header:
        raise DataFrameError("is empty (no CSV header)")
    return tuple(header)


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataFrameError("is a parquet file and reading it needs pyarrow (`pip install pyarrow`)") from e
    return pq


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    pq = _pyarrow_parquet()
    parquet = pq.ParquetFile(path)
    for batch in parquet.iter_batches(batch_size=2048):
        yield from batch.to_pylist()


def open_dataframe(path: Path) -> DataFrameSource:
    """Columns and row count of a DataFrame cache; raises :class:`DataFrameError` when it cannot be read."""
    kind = file_kind(path)
    if kind == "parquet":
        pq = _pyarrow_parquet()
        try:
            meta = pq.ParquetFile(path)
            names = tuple(n for n in meta.schema_arrow.names if not n.startswith("__index_level_"))
            return DataFrameSource(path, "parquet", names, meta.metadata.num_rows)
        except Exception as e:  # pyarrow raises its own error types for every kind of damage
            raise DataFrameError(f"is not a readable parquet file ({e})") from e
    if kind in ("zip", "csv"):
        return DataFrameSource(path, "csv.zip" if kind == "zip" else "csv", _csv_header(path), None)
    raise DataFrameError("is not a CSV, zipped CSV or parquet file")
