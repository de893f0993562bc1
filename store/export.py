"""Rows out of the store for analysis: streamed JSONL, CSV, JSON and Parquet, and pandas / Hugging Face frames.

Contract:

* Every writer takes the rows :meth:`store.store.Store.query_rows` streams
  and never holds more than one batch of them (:data:`BATCH_ROWS` rows of at
  most :data:`BATCH_BYTES` of text for Parquet, one row for the text
  formats), over the query's partitions of about a constant size
  (:mod:`store.repository`): exporting millions of rows takes constant
  memory, wide rows (per-token logprobs) included.
* The columns are those of ``judgestore query`` (:func:`store.rows.row_columns`:
  the database's location, then the record's fields), or the ones asked for.
  JSONL, CSV and JSON are what ``query --format`` prints (``query`` uses these
  writers). JSON values keep NaN and infinities as ``{"$float": ...}``
  (:mod:`store.jsonvalues`).
* Parquet columns are typed: strings, ``sample_index`` int64, ``created_at``
  a UTC timestamp (microseconds); ``usage`` and ``top_logprobs`` are JSON text
  in Arrow's JSON extension type (a plain string where pyarrow predates it),
  so the file holds exactly what the store does, whatever the shape of
  those values. The file is written beside its destination and renamed into
  place, so a failed export leaves no partial file; it gets the permissions the
  file it replaces had, else those the umask gives a new file (as `>` would).
  A link's target is replaced, not the link; a device or a pipe
  (``/dev/stdout``, a FIFO) is written in place. A destination that cannot
  be written (a folder, a full disk, a folder that is not there: none is
  made, as ``open`` makes none) is an
  :class:`~store.errors.OutputWriteError` naming it.
* :func:`to_pandas` and :func:`to_dataset` build a ``pandas.DataFrame`` or a
  ``datasets.Dataset`` from the same batches, so notebooks never open SQLite by
  hand. pyarrow, pandas and datasets are optional: each is imported only by
  what needs it, and a missing one raises
  :class:`~store.errors.MissingDependencyError` naming what to install.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import orjson

from store import jsonvalues
from store.errors import ChangedUnderReadError, InvalidInputError, MissingDependencyError, install_hint
from store.layout import Selector
from store.outputs import replacing, written_in_place
from store.rows import FoundRow, row_columns
from store.store import Store
from store.tables.filters import RowFilter, roles_for

if TYPE_CHECKING:
    import pandas
    import pyarrow

TextFormat = Literal["jsonl", "csv", "json"]
ExportFormat = Literal["parquet", "jsonl", "csv", "json"]
BATCH_ROWS = 10_000
BATCH_BYTES = 32 << 20  # and at most about this much text: rows with per-token logprobs are 100 KB and more
JSON_COLUMNS = frozenset({"usage", "top_logprobs"})
INTEGER_COLUMNS = frozenset({"sample_index"})
TIME_COLUMNS = frozenset({"created_at"})


def _plain_default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def json_text(value: object) -> str:
    """Compact JSON of an exported value (NaN and infinities tagged, datetimes in ISO 8601)."""
    return orjson.dumps(jsonvalues.to_plain(value), default=_plain_default).decode()


def text_cell(value: Any) -> str:
    """One CSV cell: empty for NULL, ISO 8601 for times, JSON for JSON values."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json_text(value)
    return str(value)


def write_text(
    rows: Iterable[FoundRow], out: IO[str], fmt: TextFormat, columns: tuple[str, ...], *, kept: bool = True
) -> int:
    """Write rows to ``out`` as they come (JSONL, CSV with a header, or one JSON array); returns how many.

    An error or a ``KeyboardInterrupt`` (Ctrl-C) leaves the output as it stopped, the JSON array unclosed (an
    incomplete output never parses as a complete one), and gets ``rows_written``: the rows whole in ``out``
    before it. An error after some rows reached ``out`` also gets a note saying how many, and that the output is
    incomplete, unless ``out`` is not ``kept`` (a temporary file the caller discards on an error).

    CSV lines end in ``\\n``; a cell holding a carriage return is quoted (the csv module quotes only the
    characters of its line terminator, and a reader takes a bare ``\\r`` for the end of a line).
    """
    written = 0
    try:
        if fmt == "csv":
            plain = csv.writer(out, lineterminator="\n")
            quoted = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
            plain.writerow(columns)
            for row in rows:
                values = row.as_dict()
                cells = [text_cell(values.get(name)) for name in columns]
                (quoted if any("\r" in cell for cell in cells) else plain).writerow(cells)
                written += 1
            return written
        for row in rows:
            values = row.as_dict()
            line = json_text({name: values[name] for name in columns if name in values})
            if fmt == "json":  # "[" only with the first row: an error before it leaves the output empty
                out.write(("[\n" if written == 0 else ",\n") + line)
            else:
                out.write(line + "\n")
            written += 1
    except BaseException as e:
        e.rows_written = written  # type: ignore[attr-defined]  # for the CLI's line (store.cli.common.interrupted)
        if kept and written and isinstance(e, Exception) and not isinstance(e, BrokenPipeError):
            left = ", its JSON array left open" if fmt == "json" else ""
            e.add_note(f"The {fmt} output stopped after {written} rows and is incomplete{left}.")
        raise
    if fmt == "json":
        out.write("\n]\n" if written else "[]\n")
    return written


# ---------------------------------------------------------------- Arrow and Parquet


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as e:
        raise MissingDependencyError(
            "Parquet and DataFrame export need pyarrow: " + install_hint("export", "pyarrow pandas")
        ) from e
    return pyarrow


def arrow_schema(columns: tuple[str, ...], *, json_type: bool = True) -> pyarrow.Schema:
    """The typed Arrow schema of exported ``columns`` (see the module docstring)."""
    pa = _pyarrow()
    text_json = pa.json_(pa.string()) if json_type and hasattr(pa, "json_") else pa.string()

    def arrow_type(name: str) -> Any:
        if name in INTEGER_COLUMNS:
            return pa.int64()
        if name in TIME_COLUMNS:
            return pa.timestamp("us", tz="UTC")
        if name in JSON_COLUMNS:
            return text_json
        return pa.string()

    return pa.schema([pa.field(name, arrow_type(name), nullable=name not in INTEGER_COLUMNS) for name in columns])


def record_batches(
    rows: Iterable[FoundRow], columns: tuple[str, ...], *, batch_rows: int = BATCH_ROWS, json_type: bool = True
) -> Iterator[pyarrow.RecordBatch]:
    """``rows`` as typed record batches of at most ``batch_rows`` rows and about :data:`BATCH_BYTES` of text."""
    pa = _pyarrow()
    schema = arrow_schema(columns, json_type=json_type)
    storage = {field.name: getattr(field.type, "storage_type", field.type) for field in schema}
    batch: dict[str, list[Any]] = {name: [] for name in columns}
    count = held = 0

    def flush() -> Any:
        arrays = []
        for field in schema:
            array = pa.array(batch[field.name], type=storage[field.name])
            if array.type != field.type:  # the JSON extension type wraps its string storage
                array = pa.ExtensionArray.from_storage(field.type, array)
            arrays.append(array)
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    for row in rows:
        values = row.as_dict()
        for name in columns:
            value = values.get(name)
            if value is not None and name in JSON_COLUMNS:
                value = jsonvalues.dumps(value)
            if isinstance(value, str):
                held += len(value)
            batch[name].append(value)
        count += 1
        if count == batch_rows or held >= BATCH_BYTES:
            yield flush()
            batch = {name: [] for name in columns}
            count = held = 0
    if count:
        yield flush()


def write_parquet(rows: Iterable[FoundRow], path: Path, columns: tuple[str, ...]) -> int:
    """Write rows to a Parquet file at ``path``, one row group per batch; returns how many rows."""
    pa = _pyarrow()
    import pyarrow.parquet as pq

    written = 0
    schema = arrow_schema(columns)
    try:
        with replacing(path, "wb") as handle, pq.ParquetWriter(handle, schema, compression="zstd") as writer:
            for batch in record_batches(rows, columns):
                if batch.num_rows:
                    writer.write_table(pa.Table.from_batches([batch], schema=schema))
                    written += batch.num_rows
    except KeyboardInterrupt as e:
        e.rows_written = written  # type: ignore[attr-defined]  # as write_text gives it: rows in the output
        raise
    return written


# ---------------------------------------------------------------- one call


def export_columns(selector: Selector, flt: RowFilter, columns: Iterable[str] | None = None) -> tuple[str, ...]:
    """The exported columns: ``columns`` if given (checked: known, each named once), else every column of the roles
    ``flt`` allows."""
    available = row_columns(roles_for(flt, selector.role))
    return available if columns is None else checked_columns(columns, available)


def checked_columns(columns: Iterable[str], available: tuple[str, ...]) -> tuple[str, ...]:
    """``columns`` as given, each one of ``available`` and named once (``query --columns``, ``export --columns``);
    :class:`InvalidInputError` saying which are not."""
    chosen = tuple(columns)
    unknown = [name for name in chosen if name not in available]
    if not chosen:  # --columns "" or ", ," (was: "unknown column(s) []")
        raise InvalidInputError(f"no column named; choose from {', '.join(available)}")
    if unknown:
        raise InvalidInputError(f"unknown column(s) {unknown}; choose from {', '.join(available)}")
    # A repeat would be two columns of one name: Parquet's readers refuse such a file, and JSON keeps one of them
    repeated = sorted({name for name in chosen if chosen.count(name) > 1})
    if repeated:
        raise InvalidInputError(f"column(s) {', '.join(repeated)} named more than once; name each column once")
    return chosen


def export_rows(
    store: Store,
    destination: Path | IO[str],
    fmt: ExportFormat,
    selector: Selector | None = None,
    flt: RowFilter | None = None,
    *,
    columns: Iterable[str] | None = None,
    limit: int | None = None,
) -> int:
    """Export the rows ``flt`` matches in the databases ``selector`` picks; returns how many rows were written.

    ``destination`` is a path (written atomically) or, for the text formats,
    an open text stream.
    """
    selector, flt = selector or Selector(), flt or RowFilter()
    chosen = export_columns(selector, flt, columns)
    if fmt == "parquet" and not isinstance(destination, Path):
        raise InvalidInputError("Parquet is written to a file: give a path")
    # A file is written beside it and renamed into place: until then nothing reached it, so a read a writer
    # changed under (a folder store's read-only reads take no lock) is made again from the start, as a count is
    again = _READ_AGAIN if isinstance(destination, Path) and not written_in_place(destination) else 1
    for _ in range(again - 1):
        try:
            return _export_once(store, destination, fmt, selector, flt, chosen, limit)
        except ChangedUnderReadError:
            continue
    return _export_once(store, destination, fmt, selector, flt, chosen, limit)  # the last: its error is raised


_READ_AGAIN = 3  # reads of an export to a file, each from the start, while writers change the store under them


def _export_once(
    store: Store,
    destination: Path | IO[str],
    fmt: ExportFormat,
    selector: Selector,
    flt: RowFilter,
    chosen: tuple[str, ...],
    limit: int | None,
) -> int:
    with closing(store.query_rows(selector, flt, limit=limit)) as rows:  # an interrupt ends the read, store open
        if fmt == "parquet":
            assert isinstance(destination, Path)  # checked by export_rows
            return write_parquet(rows, destination, chosen)
        if isinstance(destination, Path):
            with replacing(destination, "w") as handle:  # a temporary file, but for a pipe or a device
                return write_text(rows, handle, fmt, chosen, kept=written_in_place(destination))
        return write_text(rows, destination, fmt, chosen)


# ---------------------------------------------------------------- frames


def _store(source: Store | Path | str) -> tuple[Store, bool]:
    """The store ``source`` names, and whether this call opened it (and closes it): a store; a server's URL (text
    with ``://``); or a store root, which must be there: a mistyped root is not an empty store."""
    if isinstance(source, Store):
        return source, False
    if isinstance(source, str) and "://" in source:
        return Store(url=source, readonly=True), True
    store = Store(root=source, readonly=True)
    try:
        store.require_present("to read", "the path given")
    except BaseException:
        store.close()
        raise
    return store, True


def to_arrow(
    source: Store | Path | str,
    selector: Selector | None = None,
    flt: RowFilter | None = None,
    *,
    columns: Iterable[str] | None = None,
    limit: int | None = None,
    json_type: bool = True,
) -> pyarrow.Table:
    """The matching rows as one typed ``pyarrow.Table`` (``source``: a store, or a store root or a server's URL,
    opened read-only for the call)."""
    pa = _pyarrow()
    selector, flt = selector or Selector(), flt or RowFilter()
    chosen = export_columns(selector, flt, columns)
    store, owned = _store(source)
    try:
        batches = list(record_batches(store.query_rows(selector, flt, limit=limit), chosen, json_type=json_type))
    finally:
        if owned:
            store.close()
    return pa.Table.from_batches(batches, schema=arrow_schema(chosen, json_type=json_type))


def to_pandas(
    source: Store | Path | str,
    selector: Selector | None = None,
    flt: RowFilter | None = None,
    *,
    columns: Iterable[str] | None = None,
    limit: int | None = None,
    decode_json: bool = True,
) -> pandas.DataFrame:
    """The matching rows as a ``pandas.DataFrame``.

    ``created_at`` is a UTC ``datetime64``, ``sample_index`` an integer
    column; ``usage`` and ``top_logprobs`` are decoded into Python values
    (dicts, NaN and infinities exact) unless ``decode_json=False``, which
    keeps their JSON text.
    """
    try:
        import pandas
    except ImportError as e:
        raise MissingDependencyError("to_pandas needs pandas: " + install_hint("export", "pyarrow pandas")) from e
    table = to_arrow(source, selector, flt, columns=columns, limit=limit, json_type=False)
    frame = table.to_pandas()
    if decode_json:
        for name in JSON_COLUMNS & set(frame.columns):
            decoded = [jsonvalues.loads(text) if isinstance(text, str) else None for text in frame[name]]
            frame[name] = pandas.Series(decoded, index=frame.index, dtype=object)
    return frame


def to_dataset(
    source: Store | Path | str,
    selector: Selector | None = None,
    flt: RowFilter | None = None,
    *,
    columns: Iterable[str] | None = None,
    limit: int | None = None,
) -> Any:
    """The matching rows as a Hugging Face ``datasets.Dataset`` (needs the ``datasets`` package).

    The columns are those of :func:`to_arrow`; ``usage`` and ``top_logprobs``
    stay JSON text (their shapes vary from row to row, which a Dataset's
    features cannot hold); read them with ``json.loads`` or
    :func:`store.jsonvalues.loads`.
    """
    try:
        import datasets
    except ImportError as e:
        raise MissingDependencyError("to_dataset needs the datasets package: `pip install datasets`") from e
    return datasets.Dataset(to_arrow(source, selector, flt, columns=columns, limit=limit, json_type=False))
