"""Commands open only the databases their filters can match, and say exactly what a full scan says."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.backends.sqlite.catalog import catalog_path
from store.catalog import CATALOG_FORMAT, Catalog
from store.descriptor import ModelDescriptor
from store.layout import Location, Selector, metadata_bytes, write_metadata
from store.schema import DatabaseState
from store.settings import Settings
from store.stats import store_stats
from store.store import Store
from store.tables.filters import RowFilter, roles_for
from tests.factories import completion_record, judgement_record, settled

FILTERS = [
    RowFilter(model="m-0"),
    RowFilter(model="m-2"),
    RowFilter(model="nobody"),
    RowFilter(model="judged-1"),
    RowFilter(benchmark="bench-1"),
    RowFilter(benchmark="bench-1", model="m-1"),
    RowFilter(judge="judge-0"),
    RowFilter(model_a="judged-0"),
    RowFilter(pair=("judged-1", "judged-0")),
    RowFilter(run_id="run-2"),
    RowFilter(finish_reasons=("length",)),
    # Text a server cannot hold as it is (U+0000), and its escape character (U+FDD0): the filter's value is
    # escaped as the stored one was, on the way to every database (the server's survey included).
    RowFilter(model="m-\ufdd0"),
    RowFilter(benchmark="bench-\x00"),
    RowFilter(model="m-\ufdd0", benchmark="bench-\x00"),
]


def descriptor(i: int) -> ModelDescriptor:
    return ModelDescriptor(provider="vllm", model=f"org/model-{i}")


def fill(store: Store) -> None:
    """Four completion databases (models m-i, benchmarks bench-i%2, runs), one of two rows whose model and
    benchmark hold U+FDD0 and U+0000, and two judgement databases."""
    for i in range(4):
        rows = [completion_record(10 * i + k, model=f"m-{i}", benchmark=f"bench-{i % 2}", run_id=f"run-{i}")
                for k in range(3)]  # fmt: skip
        store.database("completions", f"task-{i % 2}", descriptor(i)).put_many(rows)
    odd = [completion_record(50 + k, model="m-\ufdd0", benchmark="bench-\x00") for k in range(2)]
    store.database("completions", "task-1", descriptor(4)).put_many(odd)
    for j in range(2):
        judged = [judgement_record(100 * j + k, model_a=f"judged-{j}", model_b=f"judged-{1 - j}", judge=f"judge-{j}",
                                 benchmark="bench-1") for k in range(2)]  # fmt: skip
        store.database("judgements", "task-0", descriptor(10 + j)).put_many(judged)


def full_scan(store: Store, flt: RowFilter) -> list[tuple[Location, str]]:
    """What every database says, opening each one: the answer the narrowed commands must give."""
    found = []
    for location in store.locations():
        if location.role not in roles_for(flt):  # the role's table has no such column
            continue
        database = store.open(location)
        found += [(location, record.input_hash) for record in database.query(flt)]
    return found


@pytest.fixture(params=["folder", "postgres"])
def filled(request: pytest.FixtureRequest, store_root: Path) -> Iterator[dict[str, str]]:
    """How to open a filled store (``Store(**kwargs)``)."""
    where = {"root": str(store_root)} if request.param == "folder" else {"url": request.getfixturevalue("pg_url")}
    with Store(Settings(), **where) as store:  # type: ignore[arg-type]
        fill(store)
    settled()  # a folder store's catalog taken at once would not be believed: the tests read it a second time
    yield where


@pytest.mark.parametrize("flt", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.as_dict().items()))
def test_the_narrowed_query_finds_what_a_full_scan_finds(filled: dict[str, str], flt: RowFilter) -> None:
    for _ in range(2):  # the second time through a folder store's catalog
        with Store(Settings(), readonly=True, **filled) as store:  # type: ignore[arg-type]
            narrowed = [(row.location, row.record.input_hash) for row in store.query_rows(Selector(), flt)]
            assert narrowed == full_scan(store, flt)
            counts = {(c.location, c.rows) for c in store.plan_delete(Selector(), flt).counts}
            expected: dict[Location, int] = {}
            for location, _ in narrowed:
                expected[location] = expected.get(location, 0) + 1
            assert counts == set(expected.items())


def test_a_filter_opens_only_the_databases_that_can_match(
    filled: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(Settings(), readonly=True, **filled) as store:  # type: ignore[arg-type]
        list(store.query_rows(Selector(), RowFilter(model="m-0")))  # a folder store's catalog is built
    with Store(Settings(), readonly=True, **filled) as store:  # type: ignore[arg-type]
        opened: list[Location] = []
        real = store.storage.open_existing

        def counting(location: Location) -> object:
            opened.append(location)
            return real(location)

        monkeypatch.setattr(store.storage, "open_existing", counting)
        rows = list(store.query_rows(Selector(), RowFilter(model="m-2")))
        assert len(rows) == 3 and [loc.model for loc in opened] == ["org/model-2"]
        assert list(store.query_rows(Selector(), RowFilter(model="nobody"))) == [] and len(opened) == 1
        opened.clear()  # a value the server keeps escaped is looked for escaped, not given up on (every schema)
        rows = list(store.query_rows(Selector(), RowFilter(benchmark="bench-\x00")))
        assert len(rows) == 2 and [loc.model for loc in opened] == ["org/model-4"]


def test_a_folder_copied_in_by_hand_is_found(store_root: Path) -> None:
    with Store(Settings(), root=store_root) as store:
        fill(store)
        assert list(store.query_rows(Selector(), RowFilter(model="m-0")))  # the catalog now knows every database
        source = store.locations()[0]
    copy = Location.of("completions", "task-9", descriptor(99))
    write_metadata(copy.folder(store_root), metadata_bytes("completions", "task-9", descriptor(99)))
    shutil.copyfile(source.db_path(store_root), copy.db_path(store_root))
    with Store(Settings(), root=store_root, readonly=True) as store:
        found = {row.location for row in store.query_rows(Selector(), RowFilter(model="m-0"))}
        assert copy in found and source in found
        assert copy in {info.location for info in store.infos(store.locations())}


def test_a_stale_catalog_is_never_believed(store_root: Path) -> None:
    with Store(Settings(), root=store_root) as store:
        fill(store)
    settled()
    with Store(Settings(), root=store_root, readonly=True) as store:  # the catalog is built
        assert list(store.query_rows(Selector(), RowFilter(model="new"))) == []
        before = {info.location: info.rows for info in store.infos(store.locations())}
        before_stats = {s.location: s.rows.rows for s in store_stats(store)}
    assert catalog_path(store_root).exists()
    with Store(Settings(), root=store_root) as store:  # rows with a new model, written at once
        location = store.locations()[0]
        store.open(location).put_many([completion_record(500, model="new")])
        with Store(Settings(), root=store_root, readonly=True) as reader:  # while the writer holds it open
            assert len(list(reader.query_rows(Selector(), RowFilter(model="new")))) == 1
    with Store(Settings(), root=store_root, readonly=True) as store:  # and after it closed it
        assert [row.location for row in store.query_rows(Selector(), RowFilter(model="new"))] == [location]
        after = {info.location: info.rows for info in store.infos(store.locations())}
        assert after == before | {location: (before[location] or 0) + 1}
        stats = {s.location: s.rows.rows for s in store_stats(store)}
        assert stats == before_stats | {location: before_stats[location] + 1}


def test_a_change_within_one_tick_of_a_coarse_clock_is_not_missed(
    store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a filesystem keeping whole seconds, a change made in the second a catalog was taken, the size kept, left
    the same stamp: the catalog said the database held no m-0 after it did (was). A stamp of files changed within
    that tick is none: the database is read again. Here every file time reads one second, the clock half past it."""
    from store.backends.sqlite import catalog as sqlite_catalog

    real_file, second = sqlite_catalog._file, sqlite_catalog.time.time_ns() // 10**9 * 10**9
    clock = [second + 5 * 10**8]

    def in_that_second(path: str, header: int = 0) -> list[Any] | None:
        found = real_file(path, header)
        return None if found is None else [*found[:2], second, second, found[4]]

    monkeypatch.setattr(sqlite_catalog, "_file", in_that_second)
    monkeypatch.setattr(sqlite_catalog.time, "time_ns", lambda: clock[0])
    with Store(Settings(), root=store_root) as store:
        store.database("completions", "t", descriptor(0)).put_many([completion_record(1, model="m-1")])
        (location,) = store.locations()
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert list(store.query_rows(Selector(), RowFilter(model="m-0"))) == []  # a catalog taken: no m-0 here
    with closing(sqlite3.connect(location.db_path(store_root))) as conn, conn:  # in the same second, the same size
        conn.execute("UPDATE completions SET model = 'm-0'")
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert len(list(store.query_rows(Selector(), RowFilter(model="m-0")))) == 1
    assert sqlite_catalog.stamp(location.db_path(store_root)) is None
    clock[0] = second + 3 * 10**9  # the files have stood still long enough: a stamp again
    assert sqlite_catalog.stamp(location.db_path(store_root)) is not None


def test_a_blob_in_a_text_column_is_no_crash_of_a_filter(store_root: Path) -> None:
    """A BLOB another tool stored as a model's name crashed every filtered command of the store (TypeError from
    the catalog: was); it matches no text, as SQLite compares it."""
    with Store(Settings(), root=store_root) as store:
        fill(store)
        location = store.locations()[0]
    with closing(sqlite3.connect(location.db_path(store_root))) as conn, conn:
        conn.execute("UPDATE completions SET model = CAST('m-9' AS BLOB) WHERE rowid = 1")
    settled()
    for _ in range(2):
        with Store(Settings(), root=store_root, readonly=True) as store:
            assert len(list(store.query_rows(Selector(), RowFilter(model="m-1")))) == 3
            assert list(store.query_rows(Selector(), RowFilter(model="m-9"))) == []
    from typer.testing import CliRunner

    from store.cli.app import build_app

    said = CliRunner().invoke(build_app(), ["query", "--model", "zzz", "--store-root", str(store_root)])
    assert said.exit_code == 0 and "No row here has --model 'zzz'" in said.stderr, said.output  # a TypeError (was)


def test_a_catalog_entry_that_is_no_object_is_ignored(store_root: Path) -> None:
    """Valid JSON whose entry is a number crashed every command (AttributeError: was), where a damaged catalog
    is ignored."""
    with Store(Settings(), root=store_root) as store:
        fill(store)
    settled()
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert list(store.query_rows(Selector(), RowFilter(model="m-0")))
    path = catalog_path(store_root)
    doc = orjson.loads(path.read_bytes())
    doc["entries"] = {key: 5 for key in doc["entries"]}
    path.write_bytes(orjson.dumps(doc))
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert len(list(store.query_rows(Selector(), RowFilter(model="m-0")))) == 3


def test_a_database_replaced_by_another_file_is_read_again(store_root: Path) -> None:
    with Store(Settings(), root=store_root) as store:
        fill(store)
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert len(list(store.query_rows(Selector(), RowFilter(model="m-1")))) == 3
        by_model = {location.model: location for location in store.locations()}
        first, second = by_model["org/model-0"], by_model["org/model-1"]
    target = second.db_path(store_root)
    stat = target.stat()
    shutil.copyfile(first.db_path(store_root), target)  # m-0's rows now under m-1's descriptor
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same modification time as before
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert {row.location for row in store.query_rows(Selector(), RowFilter(model="m-0"))} == {first, second}
        assert list(store.query_rows(Selector(), RowFilter(model="m-1"))) == []


def test_a_hot_journal_that_goes_away_is_noticed(store_root: Path) -> None:
    """A killed writer's hot journal makes the file unreadable read-only; once a writer rolls it back (or it is
    deleted), the database file itself often unchanged, the listing says so."""
    with Store(Settings(), root=store_root) as store:
        fill(store)
        location = store.locations()[0]
    path = location.db_path(store_root)
    journal = Path(f"{path}-journal")
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA synchronous=OFF")  # the journal's header is written whole at once: it reads as hot
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE completions SET completion = 'changed'")
        hot = journal.read_bytes()  # what a writer killed here leaves; the database file is not written yet
        conn.execute("ROLLBACK")
    journal.write_bytes(hot)

    def state() -> DatabaseState:
        with Store(Settings(), root=store_root, readonly=True) as store:
            (info,) = store.infos([location], count_rows=False)
            return info.state

    assert state() is not DatabaseState.CURRENT
    journal.unlink()  # as a writer's rollback does, leaving the database's bytes as they were
    assert state() is DatabaseState.CURRENT


def test_a_damaged_catalog_is_ignored_and_rebuilt(store_root: Path) -> None:
    with Store(Settings(), root=store_root) as store:
        fill(store)
    settled()
    with Store(Settings(), root=store_root) as store:
        assert list(store.query_rows(Selector(), RowFilter(model="m-0")))
    path = catalog_path(store_root)
    path.write_bytes(b"{not json")
    with Store(Settings(), root=store_root, readonly=True) as store:
        assert len(list(store.query_rows(Selector(), RowFilter(model="m-0")))) == 3
    assert orjson.loads(path.read_bytes())["entries"]


def test_listing_and_stats_from_the_catalog_are_what_the_files_say(store_root: Path) -> None:
    with Store(Settings(), root=store_root) as store:
        fill(store)
    answers = []
    for _ in range(2):
        with Store(Settings(), root=store_root, readonly=True) as store:
            infos = [info.as_dict() for info in store.infos(store.locations())]
            statuses = [info.as_dict() for info in store.infos(store.locations(), count_rows=False)]
            stats = [s.as_dict() for s in store_stats(store)]
            answers.append((infos, statuses, stats))
    assert answers[0] == answers[1]
    assert all(status["rows"] is None for status in answers[0][1])


def test_a_server_lists_its_schemas_together_as_it_reads_each(pg_url: str) -> None:
    with Store(Settings(), url=pg_url) as store:
        fill(store)
        locations = store.locations()
        storage = store.storage
        for count_rows in (True, False):
            together = list(storage.infos(locations, count_rows=count_rows))
            assert together == [storage.info(location, count_rows=count_rows) for location in locations]
        assert all(info.rows in (2, 3) and info.size_bytes > 0 for info in storage.infos(locations))


def test_a_server_store_is_surveyed_a_few_schemas_per_transaction(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A transaction keeps a lock on every table it reads: 5,000 schemas in one ran a server out of lock slots,
    # and every schema was then read alone (45,000 statements for one `ls`).
    import store.backends.postgres.status as status
    import store.backends.postgres.storage as storage

    with Store(Settings(), url=pg_url) as store:
        fill(store)
        locations = store.locations()
        before = [info.as_dict() for info in store.infos(locations)]
        narrowed_before = store.storage.narrowed(locations, RowFilter(model="m-1"))
        monkeypatch.setattr(status, "EXISTS_BATCH", 2)
        monkeypatch.setattr(storage, "EXISTS_BATCH", 2)
        monkeypatch.setattr(status, "schema_info", lambda *a, **k: pytest.fail("a schema was read alone"))
        opened: list[dict[str, bool]] = []
        connection = store.storage.connection  # type: ignore[attr-defined]

        def counted(**kwargs: bool) -> Any:
            opened.append(kwargs)
            return connection(**kwargs)

        monkeypatch.setattr(store.storage, "connection", counted)
        monkeypatch.setattr(store.storage.catalog, "known", lambda *args: None)  # every schema is read again
        assert [info.as_dict() for info in store.infos(locations)] == before
        assert len(opened) == 1 + 4  # the stamps, then seven schemas, two per transaction
        assert store.storage.narrowed(locations, RowFilter(model="m-1")) == narrowed_before
        # The stamps, the distinct values (seven schemas, two per transaction), then the schemas they leave, probed.
        assert len(opened) == 5 + 1 + 4 + -(-len(narrowed_before) // 2)


# v1 kept null for the seconds totals that summed to inf: stats crashed on it, also once the totals were mended
@pytest.mark.parametrize(
    ("fmt", "believed"), [(CATALOG_FORMAT, True), ("judgestore-catalog/v0", False), ("judgestore-catalog/v1", False)]
)
def test_a_catalog_of_another_format_is_not_read(tmp_path: Path, fmt: str, believed: bool) -> None:
    """A catalog written by another format of it (an older library) may mean other things by the same names."""
    path = tmp_path / "catalog.json"
    kept = Catalog(path, "store")
    kept.keep("db", [1, 2], "rows", 42)
    kept.save()
    doc = orjson.loads(path.read_bytes())
    path.write_bytes(orjson.dumps({**doc, "format": fmt}))
    assert Catalog(path, "store").known("db", [1, 2], "rows") == ((42,) if believed else None)
