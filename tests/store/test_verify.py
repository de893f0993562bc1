"""verify: integrity, metadata, schema, every row's input hash, and stray files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store.backends.sqlite.verify import stray_paths, verify_database
from store.errors import DamagedValueError, MetadataMissingError
from store.layout import Location, Selector, select
from store.reports import ProblemKind
from store.settings import Settings
from store.store import Store
from tests.factories import JUDGE, LLAMA, QWEN, completion_record, file_digests, left_behind
from tests.store.conftest import location_of


def test_verify_passes_a_clean_store(filled: Path, settings: Settings) -> None:
    before = file_digests(filled)
    results = [verify_database(filled, loc, settings) for loc in select(filled)]
    assert all(r.ok for r in results), [r.problems for r in results]
    assert sum(r.rows_checked for r in results) == 10
    assert stray_paths(filled) == []
    assert file_digests(filled) == before


def test_verify_finds_a_row_whose_input_was_edited(filled: Path, settings: Settings) -> None:
    qwen = location_of(filled, QWEN)
    victim = completion_record(1, model="qwen").input_hash
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute(
            "UPDATE completions SET input_text = ? WHERE input_hash = ?", ('{"type":"text","text":"x"}', victim)
        )
    conn.close()
    result = verify_database(filled, qwen, settings)
    assert [p.kind for p in result.problems] == [ProblemKind.INPUT_HASH]
    assert victim in result.problems[0].message and result.problems[0].where == str(qwen.db_path(filled))
    # This database's row alone: the same input is in other databases too (an input hash alone picked them all)
    assert f"judgestore delete {qwen.selector_options()} --input-hash {victim}`" in result.problems[0].message
    assert qwen.selector_options() == f"--role completions --task mt-bench --descriptor {QWEN.hash16()}"


def test_verify_finds_metadata_schema_and_file_problems(filled: Path, settings: Settings) -> None:
    qwen, llama, judge = (location_of(filled, d) for d in (QWEN, LLAMA, JUDGE))
    (qwen.folder(filled) / "metadata.json").write_text("{}")
    with sqlite3.connect(llama.db_path(filled)) as conn:
        conn.execute("UPDATE judgestore_alembic_version SET version_num = '9999'")
    conn.close()
    judge.db_path(filled).write_bytes(b"\0" * 4096)

    kinds = {loc.model: [p.kind for p in verify_database(filled, loc, settings).problems] for loc in select(filled)}
    assert kinds == {
        "Qwen/Qwen3-8B": [ProblemKind.METADATA],
        "meta-llama/Llama-3.1-8B": [ProblemKind.SCHEMA],
        "judge-1": [ProblemKind.FILE],
    }


def test_stray_paths_lists_what_is_not_part_of_the_layout(filled: Path) -> None:
    qwen = location_of(filled, QWEN)
    (filled / "notes.txt").write_text("hi")
    (filled / "completions" / "mt-bench" / "stray.db").write_text("x")
    (filled / "judgements" / "bad%zzsegment").mkdir()
    (qwen.folder(filled) / "copy.db").write_text("x")
    (qwen.folder(filled) / f"completions.db.bak-0001-{'2' * 8}").write_text("a backup is expected")
    empty = Location("completions", "mt-bench", "vllm", "x", "0" * 16).folder(filled)
    empty.mkdir(parents=True)
    left_behind(empty)

    found = {str(Path(p.where).relative_to(filled)): p.kind for p in stray_paths(filled)}
    assert set(found) == {
        "notes.txt",
        "completions/mt-bench/stray.db",
        "judgements/bad%zzsegment",
        str(qwen.relative_folder() / "copy.db"),
        str(empty.relative_to(filled)),
    }
    assert set(found.values()) == {ProblemKind.STRAY}


def test_a_selector_gets_the_strays_of_the_descriptor_folders_it_picks(filled: Path) -> None:
    """A crash while creating a database (or a damaged file deleted as verify advises) leaves a descriptor folder
    with metadata.json and no database: no listing holds it, so a filtered verify said nothing about it."""
    qwen, llama = location_of(filled, QWEN), location_of(filled, LLAMA)
    qwen.db_path(filled).unlink()
    left_behind(qwen.folder(filled))
    (filled / "notes.txt").write_text("hi")
    everything = {p.where for p in stray_paths(filled)}
    assert everything == {str(qwen.folder(filled)), str(filled / "notes.txt")}

    def strays(**fields: str) -> list[str]:
        return [p.where for p in stray_paths(filled, Selector(**fields))]  # type: ignore[arg-type]

    assert strays(model=qwen.model) == [str(qwen.folder(filled))]
    assert strays(role="completions", descriptor=qwen.descriptor_hash16) == [str(qwen.folder(filled))]
    assert strays(model=llama.model) == []
    assert strays(role="judgements") == []
    assert strays(task="no-such-task") == []


def test_what_a_process_creating_a_database_leaves_for_a_moment_is_no_stray_until_it_is_old(filled: Path) -> None:
    """A verify beside jobs creating databases failed now and then: a metadata.json being written was 'leftover of
    an interrupted write; safe to delete', and a folder whose database was a moment away 'without' it (was)."""
    qwen = location_of(filled, QWEN)
    temp = qwen.folder(filled) / ".metadata.0123456789abcdef.tmp"
    temp.write_text("{")
    fresh = Location("completions", "mt-bench", "vllm", "y", "1" * 16).folder(filled)
    fresh.mkdir(parents=True)
    (fresh / "metadata.json").write_text("{}")
    assert stray_paths(filled) == []
    left_behind(temp, fresh)  # the writer died: the same files an hour later
    found = {p.where: p.message for p in stray_paths(filled)}
    assert found == {
        str(temp): "leftover of an interrupted metadata.json write; safe to delete",
        str(fresh): "descriptor folder without completions.db",
    }


def test_a_folder_where_a_file_of_the_layout_belongs_is_named_as_such(filled: Path, settings: Settings) -> None:
    """Was: a raw ``[Errno 21] Is a directory`` for metadata.json, and 'not part of a descriptor folder
    (expected metadata.json, ...)' for an entry named metadata.json."""
    qwen = location_of(filled, QWEN)
    metadata = qwen.folder(filled) / "metadata.json"
    metadata.unlink()
    metadata.mkdir()
    before = file_digests(filled)
    (problem,) = verify_database(filled, qwen, settings).problems
    assert problem.kind is ProblemKind.METADATA and problem.where == str(metadata)
    assert problem.message == f"{metadata}: is a folder, not the file judgestore writes there (made by hand)"
    (stray,) = stray_paths(filled)
    assert stray.where == str(metadata) and stray.message == "a folder where the file metadata.json belongs"
    with Store(settings, root=filled, readonly=True) as store, pytest.raises(MetadataMissingError, match="a folder"):
        store.open(qwen)
    assert file_digests(filled) == before and metadata.is_dir()


def test_a_dangling_link_where_a_file_of_the_layout_belongs_is_named_as_such(filled: Path) -> None:
    qwen = location_of(filled, QWEN)
    metadata = qwen.folder(filled) / "metadata.json"
    metadata.unlink()
    metadata.symlink_to(qwen.folder(filled) / "gone.json")
    (stray,) = stray_paths(filled)
    assert stray.where == str(metadata) and stray.message == "a link to nothing where the file metadata.json belongs"


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("DROP TABLE runs", "table runs"),
        ("DROP TABLE claims", "table claims"),
        ("ALTER TABLE adoptions DROP COLUMN sampled", "column adoptions.sampled"),
    ],
)
def test_verify_names_a_table_or_column_another_tool_removed(
    filled: Path, settings: Settings, statement: str, named: str
) -> None:
    """A database lacking a bookkeeping table passed verify, as 'no problems' (was)."""
    qwen = location_of(filled, QWEN)
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute(statement)
    conn.close()
    before = file_digests(filled)
    (problem,) = verify_database(filled, qwen, settings).problems
    assert problem.kind is ProblemKind.SCHEMA and f"lacks {named}, which its schema revision" in problem.message
    assert file_digests(filled) == before


def test_verify_tells_a_database_whose_tables_were_dropped_from_one_being_created(
    filled: Path, settings: Settings
) -> None:
    """Zero bytes: another process is creating it (no problem). Pages but no table: its rows are gone (was: OK)."""
    qwen, llama = location_of(filled, QWEN), location_of(filled, LLAMA)
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            conn.execute(f'DROP TABLE "{name}"')
    conn.close()
    llama.db_path(filled).write_bytes(b"")
    (problem,) = verify_database(filled, qwen, settings).problems
    assert problem.kind is ProblemKind.SCHEMA and "holds no tables, though it is not empty" in problem.message
    assert verify_database(filled, llama, settings).ok


def test_a_value_that_does_not_decode_is_named_by_its_row_and_the_other_rows_are_still_checked(
    filled: Path, settings: Settings
) -> None:
    """One undecodable JSON value ended the row checks of its database with a bare JSONDecodeError (was)."""
    qwen = location_of(filled, QWEN)
    bad_json, bad_time, edited = (completion_record(i, model="qwen").input_hash for i in (0, 1, 2))
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute("UPDATE completions SET usage = '{not json' WHERE input_hash = ?", (bad_json,))
        conn.execute("UPDATE completions SET created_at = 'yesterday' WHERE input_hash = ?", (bad_time,))
        conn.execute("UPDATE completions SET input_text = input_text || ' ' WHERE input_hash = ?", (edited,))
    conn.close()
    result = verify_database(filled, qwen, settings)
    by_row = {next(k for k in (bad_json, bad_time, edited) if k in p.message): p for p in result.problems}
    assert set(by_row) == {bad_json, bad_time, edited} and len(result.problems) == 3
    assert (
        by_row[bad_json].kind is ProblemKind.VALUE and ": usage is not a value of its type" in by_row[bad_json].message
    )
    assert by_row[bad_time].kind is ProblemKind.VALUE and ": created_at is not a value" in by_row[bad_time].message
    assert by_row[edited].kind is ProblemKind.INPUT_HASH
    assert f"judgestore delete {qwen.selector_options()} --input-hash {bad_json}`" in by_row[bad_json].message
    with Store(settings, root=filled, readonly=True) as store:
        assert result.rows_checked == store.open(qwen).count()


@pytest.mark.parametrize("stored", [1767225600, 1767225600.5, b"\x00\x01"], ids=["unix-int", "unix-float", "blob"])
def test_a_time_another_tool_wrote_as_a_number_is_named_by_its_row_and_reads_refuse_it_typed(
    filled: Path, settings: Settings, stored: object
) -> None:
    """A Unix time (or bytes) in created_at crashed verify, query and export with a bare TypeError (was)."""
    qwen = location_of(filled, QWEN)
    bad = completion_record(0, model="qwen").input_hash
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute("UPDATE completions SET created_at = ? WHERE input_hash = ?", (stored, bad))
    conn.close()
    before = file_digests(filled)
    (problem,) = verify_database(filled, qwen, settings).problems
    assert problem.kind is ProblemKind.VALUE and f"row {bad} (rowid 1): created_at is not a value" in problem.message
    with Store(settings, root=filled, readonly=True) as store, pytest.raises(DamagedValueError, match="TypeError"):
        list(store.open(qwen).query())
    assert file_digests(filled) == before


@pytest.mark.parametrize(
    "stored", ["2026-01-01T02:00:00+02:00", "2026-01-01 00:00:00", "2026-01-01T00:00:00.000000"],
    ids=["offset", "sqlite-current-timestamp", "t-separator"],
)  # fmt: skip
def test_a_time_another_tool_wrote_in_another_form_is_named_by_its_row(
    filled: Path, settings: Settings, stored: str
) -> None:
    """Text times in another form read (the offset dropped), so verify said OK, while --since/--until compare the
    stored text and put such rows on the wrong side of the boundary (was)."""
    qwen = location_of(filled, QWEN)
    odd = completion_record(1, model="qwen").input_hash
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute("UPDATE completions SET created_at = ? WHERE input_hash = ?", (stored, odd))
    conn.close()
    result = verify_database(filled, qwen, settings)
    (problem,) = result.problems
    assert problem.kind is ProblemKind.VALUE and f"row {odd} (rowid 2): created_at is {stored!r}" in problem.message
    assert f"judgestore delete {qwen.selector_options()} --input-hash {odd}`" in problem.message
    with Store(settings, root=filled, readonly=True) as store:
        assert result.rows_checked == store.open(qwen).count()  # every row checked once, the odd one included
    with sqlite3.connect(qwen.db_path(filled)) as conn:  # in the store's own form again: nothing to say
        conn.execute("UPDATE completions SET created_at = '2026-01-01 00:00:00.000000' WHERE input_hash = ?", (odd,))
    conn.close()
    assert verify_database(filled, qwen, settings).ok


def test_a_row_named_for_one_fault_is_not_named_again_for_its_time(filled: Path, settings: Settings) -> None:
    """A time not UTF-8 made the odd-time scan fail the whole file, its rows uncounted; an edited row with an odd
    time was named, and counted, twice (was)."""
    qwen = location_of(filled, QWEN)
    undecodable, edited = (completion_record(i, model="qwen").input_hash for i in (0, 1))
    with sqlite3.connect(qwen.db_path(filled)) as conn:
        conn.execute("UPDATE completions SET created_at = CAST(X'323032362D30312D3031FF' AS TEXT) WHERE input_hash = ?",
                     (undecodable,))  # fmt: skip
        conn.execute(
            "UPDATE completions SET input_text = input_text || ' ', created_at = replace(created_at, ' ', 'T') "
            "WHERE input_hash = ?",
            (edited,),
        )
    conn.close()
    result = verify_database(filled, qwen, settings)
    by_row = {next(k for k in (undecodable, edited) if k in p.message): p for p in result.problems}
    assert len(result.problems) == 2 and set(by_row) == {undecodable, edited}
    assert (
        by_row[undecodable].kind is ProblemKind.TEXT and "created_at is not valid UTF-8" in by_row[undecodable].message
    )
    assert by_row[edited].kind is ProblemKind.INPUT_HASH
    with Store(settings, root=filled, readonly=True) as store:
        assert result.rows_checked == store.open(qwen).count()
