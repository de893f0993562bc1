"""The audit with a deterministic fake engine: sampling, regeneration without the store, comparison."""

from __future__ import annotations

import math
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from inference.cache.model import CachedModel
from inference.drift.audit import audit_database, compare, logprob_deltas, regenerate, sample_rows
from inference.requests import CompletionRequest, JudgementRequest, Sample
from store.descriptor import ModelDescriptor
from store.errors import InvalidInputError
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import file_digests
from tests.inference.test_cached import CountingBackend, Factory

DESCRIPTOR = ModelDescriptor(provider="vllm", model="tiny", sampling={"temperature": 0.0, "logprobs": 2})


@dataclass
class FakeSpec:
    """What a run needs of a model (inference.spec.Spec), with the counting fake engine behind it."""

    backend: CountingBackend
    descriptor: ModelDescriptor = DESCRIPTOR
    display_name: str = "tiny"

    def cached(self, store: Store | None, *, task: str, mode: Any = "use", **kw: Any) -> CachedModel:
        return CachedModel(store, self.descriptor, task=task, backend_factory=Factory(self.backend), mode=mode, **kw)

    def sent(self) -> None:
        return None  # an in-process engine sends nothing to a server


def ask(i: int, n: int = 1) -> CompletionRequest:
    return CompletionRequest(messages=[{"role": "user", "content": f"q{i}"}], benchmark="b", instruction_id=str(i), n=n)


@pytest.fixture
def filled(store: Store) -> Store:
    spec = FakeSpec(CountingBackend())
    spec.cached(store, task="t").complete([ask(i, n=2 if i == 3 else 1) for i in range(12)])
    spec.cached(store, task="t").judge(
        [
            JudgementRequest(messages=[{"role": "user", "content": f"judge {i}"}], model_a="x", model_b="y")
            for i in range(3)
        ]
    )
    return store


def test_samples_are_random_repeatable_and_filtered(filled: Store) -> None:
    database = filled.database("completions", "t", DESCRIPTOR)
    first = [r.input_hash for r in sample_rows(database, 5, seed=1)]
    assert len(set(first)) == 5 and first == [r.input_hash for r in sample_rows(database, 5, seed=1)]
    assert {r.input_hash for r in sample_rows(database, 5, seed=2)} != set(first)
    assert len(sample_rows(database, 100, seed=1)) == 13  # every row, wrapping around the key space
    only = sample_rows(database, 5, seed=1, flt=RowFilter(instruction_id="3"))
    assert sorted(r.sample_index for r in only) == [0, 1]
    with pytest.raises(InvalidInputError):
        sample_rows(database, -1)


def test_an_audit_of_untouched_rows_is_all_exact_and_writes_nothing(filled: Store) -> None:
    filled.close()
    before = file_digests(filled.root)
    backend = CountingBackend()
    with Store(Settings(), root=filled.root, readonly=True) as readonly:
        database = readonly.find("completions", "t", DESCRIPTOR)
        assert database is not None
        report = audit_database(database, FakeSpec(backend), sample=50, seed=0)
    assert (report.sampled, report.exact, report.exact_rate, report.rows_in_database) == (13, 13, 1.0, 13)
    assert report.max_abs_logprob_delta == 0.0 and report.top_tokens_changed == 0
    assert len(backend.received) == 13  # sample 1 of q3 regenerated as sample 1, once
    assert file_digests(filled.root) == before
    judged = audit_database(filled.database("judgements", "t", DESCRIPTOR), FakeSpec(CountingBackend()), sample=3)
    assert judged.exact_rate == 1.0 and judged.as_dict()["sampled"] == 3


def test_an_audit_without_a_seed_gives_the_one_it_drew_and_it_picks_the_same_rows(filled: Store) -> None:
    """Without --sample-seed the report said `"seed": null`: the rows it audited could not be picked again (was)."""
    database = filled.database("completions", "t", DESCRIPTOR)
    drawn = audit_database(database, FakeSpec(CountingBackend()), sample=4)
    assert isinstance(drawn.seed, int) and f"--sample-seed {drawn.seed} picks the same rows" in drawn.lines()[0]
    again = audit_database(database, FakeSpec(CountingBackend()), sample=4, seed=drawn.seed)
    assert [r.input_hash for r in again.rows] == [r.input_hash for r in drawn.rows] and again.seed == drawn.seed


def test_an_altered_completion_is_found_with_its_first_difference(filled: Store) -> None:
    database = filled.database("completions", "t", DESCRIPTOR)
    with closing(sqlite3.connect(database.path)) as conn, conn:
        conn.execute("UPDATE completions SET completion = 'answer to q5 #9' WHERE instruction_id = '5'")
    report = audit_database(database, FakeSpec(CountingBackend()), sample=13, seed=4)
    (mismatch,) = report.mismatches
    assert mismatch.instruction_id == "5" and mismatch.first_difference == len("answer to q5 #")
    assert (mismatch.stored, mismatch.regenerated) == ("answer to q5 #9", "answer to q5 #0")
    assert report.exact == 12 and report.as_dict()["mismatches"][0]["first_difference"] == 14


def test_a_stored_finish_reason_the_engine_does_not_give_is_a_mismatch(filled: Store) -> None:
    """The same text ending otherwise was "exact" (was), and adopt carried the stored finish reason, which a hit
    serves, over; a finish reason not known (a legacy row's) says nothing either way."""
    database = filled.database("completions", "t", DESCRIPTOR)
    with closing(sqlite3.connect(database.path)) as conn, conn:
        given = conn.execute("SELECT finish_reason FROM completions WHERE instruction_id = '5'").fetchone()[0]
        conn.execute("UPDATE completions SET finish_reason = 'length' WHERE instruction_id = '5'")
        conn.execute("UPDATE completions SET finish_reason = NULL WHERE instruction_id = '6'")
    report = audit_database(database, FakeSpec(CountingBackend()), sample=13, seed=4)
    (mismatch,) = report.mismatches
    assert mismatch.instruction_id == "5" and mismatch.first_difference is None and report.exact == 12
    assert (mismatch.finish_reason_stored, mismatch.finish_reason_regenerated) == ("length", given)
    assert f"ends otherwise: finish reason 'length' -> {given!r}" in "\n".join(report.lines())


def test_regenerating_needs_a_model_without_the_store(filled: Store) -> None:
    rows = sample_rows(filled.database("completions", "t", DESCRIPTOR), 2, seed=0)
    with pytest.raises(InvalidInputError, match="mode 'off'"):
        regenerate(FakeSpec(CountingBackend()).cached(filled, task="t"), rows)


def test_logprob_deltas_compare_the_first_token_view(store: Store, tmp_path: Path) -> None:
    spec = FakeSpec(CountingBackend())
    spec.cached(store, task="t").complete([ask(0)])
    (row,) = store.database("completions", "t", DESCRIPTOR).query()
    moved = Sample(row.input_hash, 0, row.completion, "stop", None, {"x": -0.25, "y": -3.0}, cached=False)
    audit = compare(row, moved)
    assert audit.exact and audit.logprob_deltas == {"x": 0.25, "y": 0.0} and audit.max_abs_delta == 0.25
    flipped = Sample(row.input_hash, 0, row.completion + "!", "length", None, {"x": -5.0, "z": -0.1}, cached=False)
    changed = compare(row, flipped)
    assert changed.top_token_changed and (changed.top_token_stored, changed.top_token_regenerated) == ("x", "z")
    assert changed.first_difference == len(row.completion) and not changed.exact
    assert changed.logprob_deltas == {"x": -4.5, "z": pytest.approx(0.4)}  # z joined from below -0.5 at least
    assert Settings().record_runs  # audits never add to the runs either: the model runs without the store


def test_a_candidate_that_crossed_the_edge_of_the_top_k_counts_as_the_least_move_it_implies() -> None:
    """A verdict token that dropped out of the top k counted as no change: an adoption with --max-logprob-delta
    0.01 was met with a candidate that had moved by 0.75 at least (was)."""
    before, after = {"A": -0.1, "B": -1.7, "C": -2.0}, {"A": -0.1, "C": -2.0, "D": -2.5}
    assert logprob_deltas(before, after) == {"A": 0.0, "B": pytest.approx(-0.8), "C": 0.0, "D": 0.0}
    assert logprob_deltas({"A": -0.1, "B": -1.0}, {"A": -0.1, "Z": -0.4}) == {"A": 0.0, "B": 0.0, "Z": 0.6}
    assert logprob_deltas({"A": -0.1, "B": -0.2}, {"A": -0.1, "C": -math.inf})["B"] == -math.inf
    assert logprob_deltas({"A": -0.1}, {"A": -0.1, "B": -math.inf}) == {"A": 0.0, "B": 0.0}
    assert logprob_deltas({"A": -0.1}, {}) == logprob_deltas({}, {"A": -0.1}) == {}  # nothing to compare with


@pytest.mark.parametrize("command", [["audit"], ["explain"], ["adopt", "--across", "backend_version"]])
def test_a_task_that_names_no_folder_is_a_usage_error_of_every_diagnostic(tmp_path: Path, command: list[str]) -> None:
    """audit took it, and failed on it as a path segment with exit status 1 (was), unlike explain and adopt."""
    from typer.testing import CliRunner

    from inference.cli.app import app

    result = CliRunner().invoke(app(), [*command, "--model", "m", "--task", "..", "--store-root", str(tmp_path / "s")])
    assert result.exit_code == 2 and "Invalid value for '--task'" in result.stderr, result.output
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("command", [["audit"], ["adopt", "--across", "backend_version"]])
@pytest.mark.parametrize("seed", [str(2**63), str(-(2**63) - 1)])
def test_a_sample_seed_past_64_bits_is_a_usage_error_before_anything_runs(
    tmp_path: Path, command: list[str], seed: str
) -> None:
    """adopt took it, audited, then failed writing its record (a traceback on SQLite; "please report this value"
    on PostgreSQL) and left an empty database behind (was); audit takes the same seeds adopt does."""
    from typer.testing import CliRunner

    from inference.cli.app import app

    args = [*command, "--model", "m", "--task", "t", "--sample-seed", seed, "--store-root", str(tmp_path / "s")]
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 2 and "Invalid value for '--sample-seed'" in result.stderr, result.output
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("command", [["audit"], ["explain"], ["adopt", "--across", "backend_version"]])
def test_a_store_that_is_not_there_is_named_by_every_diagnostic(tmp_path: Path, command: list[str]) -> None:
    """'nothing is stored for m' (exit 1, or 0 for explain) never said that the store itself was missing (was)."""
    from typer.testing import CliRunner

    from inference.cli.app import app

    missing = tmp_path / "no-such-store"
    args = [*command, "--model", "m", "--task", "t", "--allow-unpinned", "--store-root", str(missing)]
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 1, result.output
    said = " ".join(result.stderr.split())
    assert f"{missing}: the folder does not exist: there is no store to" in said and "--store-root" in said
    assert not missing.exists()
