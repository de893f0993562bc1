"""Export for analysis: Parquet with typed columns equals `query --format jsonl`; frames; streamed; atomic."""

from __future__ import annotations

import io
import math
import os
import stat
import sys
import threading
import types
from pathlib import Path
from typing import Any

import orjson
import pytest

from store import export, jsonvalues
from store.errors import (
    InvalidInputError,
    JudgestoreError,
    MissingDependencyError,
    OutputWriteError,
    StoreMissingError,
)
from store.export import export_rows, record_batches, to_arrow, to_dataset, to_pandas
from store.layout import Selector
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import QWEN, completion_record, fill_small_store

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture
def filled(store_root: Path) -> Path:
    fill_small_store(store_root)
    with Store(Settings(), root=store_root) as store:  # a value JSON has no literal for must survive too
        store.database("completions", "mt-bench", QWEN).put_many(
            [completion_record(50, usage={"prompt_tokens": 1, "completion_tokens": 2, "engine_seconds": math.inf})]
        )
    return store_root


def query_jsonl(root: Path, selector: Selector, flt: RowFilter) -> list[dict[str, Any]]:
    out = io.StringIO()
    with Store(Settings(), root=root, readonly=True) as store:
        export_rows(store, out, "jsonl", selector, flt)
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    """A Parquet file's rows as `query --format jsonl` writes them (times in ISO 8601, JSON values decoded)."""
    rows = []
    for row in pq.read_table(path).to_pylist():
        for name in ("usage", "top_logprobs"):
            if row[name] is not None:
                row[name] = jsonvalues.to_plain(jsonvalues.loads(row[name]))
        row["created_at"] = row["created_at"].isoformat()
        rows.append(row)
    return rows


@pytest.mark.parametrize(
    ("selector", "flt"),
    [
        (Selector(), RowFilter()),
        (Selector(role="judgements"), RowFilter(pointwise=False)),
        (Selector(role="completions"), RowFilter(run_id="run-1")),
    ],
)
def test_parquet_round_trips_to_what_query_jsonl_prints(
    filled: Path, tmp_path: Path, selector: Selector, flt: RowFilter
) -> None:
    target = tmp_path / "rows.parquet"
    with Store(Settings(), root=filled, readonly=True) as store:
        written = export_rows(store, target, "parquet", selector, flt)
    expected = query_jsonl(filled, selector, flt)
    assert written == len(expected) > 0
    assert parquet_rows(target) == [{name: row.get(name) for name in parquet_rows(target)[0]} for row in expected]


def test_parquet_columns_are_typed(filled: Path, tmp_path: Path) -> None:
    target = tmp_path / "rows.parquet"
    with Store(Settings(), root=filled, readonly=True) as store:
        export_rows(store, target, "parquet")
    schema = pq.read_schema(target)
    assert schema.field("sample_index").type == pa.int64()
    assert schema.field("created_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("completion").type == pa.string()
    if hasattr(pa, "json_"):
        assert schema.field("usage").type == pa.json_(pa.string())
    assert schema.names[:5] == ["role", "task", "provider", "descriptor_model", "descriptor"]
    assert {"model", "model_a", "judge"} <= set(schema.names)


def test_rows_are_built_one_batch_at_a_time(filled: Path) -> None:
    with Store(Settings(), root=filled, readonly=True) as store:
        rows = store.query_rows(Selector(), RowFilter())
        sizes = [batch.num_rows for batch in record_batches(rows, ("input_hash", "created_at"), batch_rows=4)]
    assert sizes == [4, 4, 3]


def test_a_failed_export_leaves_no_file(filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "rows.parquet"
    target.write_bytes(b"the previous export")

    def broken(*_: Any, **__: Any) -> Any:
        yield from ()
        raise OSError("disk full")

    monkeypatch.setattr(export, "record_batches", broken)
    with (
        Store(Settings(), root=filled, readonly=True) as store,
        pytest.raises(OutputWriteError, match="disk full") as e,
    ):
        export_rows(store, target, "parquet")
    assert target.read_bytes() == b"the previous export" and "the file it would replace is unchanged" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.parquet", "store"]  # no temporary file left
    with Store(Settings(), root=filled, readonly=True) as store, pytest.raises(OutputWriteError) as new:
        export_rows(store, tmp_path / "new.parquet", "parquet")
    # was: "the file it would replace is unchanged", of a file that was never there
    assert "no file was created" in str(new.value) and not (tmp_path / "new.parquet").exists()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_export_respects_the_umask_and_keeps_the_mode_of_the_file_it_replaces(
    filled: Path, tmp_path: Path, fmt: str
) -> None:
    """A new file is as readable as the umask says (mkstemp's 0600 is not kept); a replaced file keeps its mode."""
    previous = os.umask(0o022)
    try:
        with Store(Settings(), root=filled, readonly=True) as store:
            export_rows(store, tmp_path / f"shared.{fmt}", fmt)  # type: ignore[arg-type]
            os.umask(0o077)
            export_rows(store, tmp_path / f"private.{fmt}", fmt)  # type: ignore[arg-type]
            kept = tmp_path / f"kept.{fmt}"
            kept.write_bytes(b"an older export")
            kept.chmod(0o640)
            export_rows(store, kept, fmt)  # type: ignore[arg-type]
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / f"shared.{fmt}").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / f"private.{fmt}").stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_bytes() != b"an older export"


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_an_export_through_a_link_replaces_its_target_and_a_pipe_is_written_in_place(
    filled: Path, tmp_path: Path, fmt: str
) -> None:
    """Renaming a file over the destination would replace the link itself, or the FIFO a reader waits on."""
    target, link, fifo = tmp_path / f"target.{fmt}", tmp_path / f"link.{fmt}", tmp_path / "fifo"
    target.write_bytes(b"an older export")
    link.symlink_to(target.name)
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    with Store(Settings(), root=filled, readonly=True) as store:
        through_link = export_rows(store, link, fmt)  # type: ignore[arg-type]
        through_fifo = export_rows(store, fifo, fmt)  # type: ignore[arg-type]
    reader.join(timeout=60)
    assert link.is_symlink() and link.resolve() == target.resolve() and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert through_link == through_fifo == 11
    assert received == [target.read_bytes()] and target.read_bytes() != b"an older export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", f"link.{fmt}", "store", f"target.{fmt}"]


@pytest.mark.parametrize(
    ("destination", "says"),
    [
        ("folder", "it is a folder, not a file"),
        ("file/rows.csv", "file is a file, not a folder"),
        ("new/deeper/rows.csv", "there is no folder .*new/deeper"),  # made both folders (was)
    ],
)
def test_a_destination_that_cannot_be_a_file_is_refused_before_a_row_is_read(
    filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, destination: str, says: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("kept")
    monkeypatch.setattr(export, "write_text", lambda *_: pytest.fail("rows were read"))
    refused = pytest.raises(OutputWriteError, match=f"{destination}: could not write the export: .*{says}")
    with Store(Settings(), root=filled, readonly=True) as store, refused:
        export_rows(store, tmp_path / destination, "csv")
    assert (tmp_path / "file").read_text() == "kept" and list((tmp_path / "folder").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder", "store"]


def test_unknown_columns_are_refused(filled: Path) -> None:
    with Store(Settings(), root=filled, readonly=True) as store, pytest.raises(InvalidInputError, match="unknown"):
        export_rows(store, io.StringIO(), "jsonl", columns=["nope"])


def test_to_pandas_types_and_decodes(filled: Path) -> None:
    pandas = pytest.importorskip("pandas")
    frame = to_pandas(filled)
    assert len(frame) == 11 and str(frame["sample_index"].dtype) == "int64"
    assert isinstance(frame["created_at"].dtype, pandas.DatetimeTZDtype) and str(frame["created_at"].dt.tz) == "UTC"
    usage = frame.set_index("instruction_id").loc["50"]["usage"]
    assert usage["engine_seconds"] == math.inf  # exact, not a string
    judged = to_pandas(filled, Selector(role="judgements"), RowFilter(pointwise=True), columns=["judge", "usage"])
    assert list(judged.columns) == ["judge", "usage"] and len(judged) == 1
    raw = to_pandas(filled, limit=2, decode_json=False)
    assert len(raw) == 2 and all(isinstance(v, str) or pandas.isna(v) for v in raw["top_logprobs"])


def test_to_arrow_accepts_an_open_store(filled: Path) -> None:
    with Store(Settings(), root=filled, readonly=True) as store:
        assert to_arrow(store, Selector(role="completions")).num_rows == 6


def test_to_dataset_needs_datasets_and_builds_one_from_arrow(filled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(MissingDependencyError, match="pip install datasets"):
        to_dataset(filled)
    fake = types.ModuleType("datasets")
    fake.Dataset = lambda table: ("Dataset", table)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    kind, table = to_dataset(filled, Selector(role="judgements"))
    assert kind == "Dataset" and table.num_rows == 5 and table.schema.field("usage").type == pa.string()


def test_without_pyarrow_parquet_says_what_to_install(filled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with Store(Settings(), root=filled, readonly=True) as store, pytest.raises(MissingDependencyError, match="export"):
        export_rows(store, filled / "x.parquet", "parquet")


def test_csv_quotes_a_carriage_return_so_a_reader_gets_the_rows_back(store_root: Path) -> None:
    """A bare CR left unquoted is the end of a line to every CSV reader: a row would split in two."""
    import csv

    texts = ["a\rb", "c\r\nd", "plain", "e\nf", ""]
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "mt-bench", QWEN).put_many(
            [completion_record(i, completion=text) for i, text in enumerate(texts)]
        )
    out = io.StringIO()
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert export_rows(store, out, "csv", columns=("instruction_id", "completion")) == len(texts)
    read = list(csv.DictReader(io.StringIO(out.getvalue(), newline="")))
    assert sorted((r["instruction_id"], r["completion"]) for r in read) == [(str(i), t) for i, t in enumerate(texts)]
    assert '"plain"' not in out.getvalue()  # rows without a CR stay as they were written before


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_a_stream_that_fails_after_rows_leaves_the_output_incomplete_and_says_so(
    filled: Path, fmt: export.TextFormat
) -> None:
    """A server gone mid-stream: the rows before it stay, a JSON array stays open, the error says how many."""
    with Store(Settings(), root=filled, readonly=True) as store:
        rows = list(store.query_rows(Selector(), RowFilter()))[:3]

    def failing() -> Any:
        yield from rows
        raise InvalidInputError("the server went away")

    out = io.StringIO()
    with pytest.raises(InvalidInputError) as caught:
        export.write_text(failing(), out, fmt, ("instruction_id",))
    assert caught.value.rows_written == 3  # type: ignore[attr-defined]
    assert "stopped after 3 rows and is incomplete" in " ".join(caught.value.__notes__)
    text = out.getvalue()
    if fmt == "json":
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(text)
        assert len(orjson.loads(text + "\n]")) == 3
    else:
        assert len(text.splitlines()) == 3 + (fmt == "csv")


def test_a_frame_of_a_store_root_that_is_not_there_is_refused_and_a_url_is_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped root gave an empty frame, and a URL was taken for a folder named like it (was)."""
    pytest.importorskip("pandas")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreMissingError, match=r"judgestore-dta: the folder does not exist: there is no store to"):
        to_pandas("judgestore-dta")
    assert not (tmp_path / "judgestore-dta").exists()
    with pytest.raises(JudgestoreError) as refused:  # a server nobody runs: refused as one, never a folder
        to_pandas("postgresql+psycopg://judge@127.0.0.1:9/judgestore")
    assert type(refused.value).__name__.startswith("Server") and not list(tmp_path.iterdir())
