"""Adopting with a deterministic fake engine: choosing the source, the thresholds, what is written, what hits after.

The real engine on the tiny model is in test_adopt_engine.py.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from inference.cache.model import CachedModel
from inference.cli.app import app
from inference.cli.options import model_spec
from inference.drift.adopt import adopt, adopt_command_line, adoption_candidates, choose_source, spec_options
from inference.requests import JudgementRequest
from inference.spec import ModelSpec
from store.adoption import adoptions
from store.backend import Database
from store.cli.options import grouped
from store.descriptor import ModelDescriptor
from store.errors import AdoptionError, CorruptDatabaseError, InvalidInputError
from store.settings import Settings
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import file_digests
from tests.inference.test_audit import FakeSpec
from tests.inference.test_cached import CountingBackend, ask

NEW = ModelDescriptor(provider="vllm", model="tiny", sampling={"temperature": 0.0, "logprobs": 2},
                      backend_version="0.32.0")  # fmt: skip
OLD = NEW.model_copy(update={"backend_version": "0.11.0"})
OLDER = NEW.model_copy(update={"backend_version": "0.10.0"})
HOTTER = OLD.model_copy(update={"sampling": NEW.sampling.model_copy(update={"temperature": 0.7})})


def fill(store: Store, descriptor: ModelDescriptor, n: int = 6, task: str = "t") -> None:
    """``n`` completions and 2 judgements written by the fake engine under ``descriptor``."""
    spec = FakeSpec(CountingBackend(), descriptor)
    spec.cached(store, task=task).complete([ask(i) for i in range(n)])
    spec.cached(store, task=task).judge(
        [JudgementRequest(messages=[{"role": "user", "content": f"judge {i}"}], model_a="x") for i in range(2)]
    )


def never() -> Any:
    pytest.fail("the engine was prepared although every request should hit")


def test_the_source_is_the_only_stored_descriptor_that_differs_in_allowed_fields_only(store: Store) -> None:
    fill(store, OLD)
    fill(store, HOTTER)
    candidates = adoption_candidates(store, "completions", "t", NEW, ["backend_version"])
    assert [c.location.descriptor_hash16 for c in candidates] == [OLD.hash16(), HOTTER.hash16()]  # nearest first
    assert [c.field for c in candidates[1].disallowed] == ["sampling.temperature"]
    assert choose_source(candidates).location.descriptor_hash16 == OLD.hash16()
    with pytest.raises(AdoptionError, match=r"sampling\.temperature 0\.7 -> 0\.0, which --across does not allow"):
        choose_source(candidates, HOTTER.hash16()[:8])
    widened = adoption_candidates(store, "completions", "t", NEW, ["backend_version", "sampling"])
    with pytest.raises(AdoptionError, match=r"2 stored descriptors differ .* --from HASH") as raised:
        choose_source(widened)
    assert str(raised.value).index(OLD.hash16()) < str(raised.value).index(HOTTER.hash16())
    with pytest.raises(AdoptionError, match=r"no stored descriptor .* starts with 'ffff"):
        choose_source(candidates, "ffff")
    with pytest.raises(AdoptionError, match="only in the allowed fields"):
        choose_source(adoption_candidates(store, "completions", "t", NEW, ["engine"]))
    with pytest.raises(InvalidInputError, match="not a descriptor field"):
        adoption_candidates(store, "completions", "t", NEW, ["backend-version"])


def test_another_task_is_a_difference_that_must_be_allowed_too(store: Store) -> None:
    fill(store, OLD, task="elsewhere")
    with pytest.raises(AdoptionError, match=r"task elsewhere -> t"):
        choose_source(adoption_candidates(store, "completions", "t", NEW, ["backend_version"]))
    allowed = adoption_candidates(store, "completions", "t", NEW, ["backend_version", "task"])
    assert choose_source(allowed).location.task == "elsewhere"
    fill(store, OLD, task="t")  # the same descriptor under two tasks: its hash alone cannot choose (was: no way to)
    both = adoption_candidates(store, "completions", "t", NEW, ["backend_version", "task"])
    with pytest.raises(AdoptionError, match=r"more than one .* \(one descriptor stored under several tasks: give"):
        choose_source(both, OLD.hash16())
    assert choose_source(both, f"elsewhere/{OLD.hash16()[:8]}").location.task == "elsewhere"
    assert choose_source(both, f"t/{OLD.hash16()}").location.task == "t"
    with pytest.raises(AdoptionError, match="no stored descriptor"):
        choose_source(both, f"nowhere/{OLD.hash16()}")


def test_with_only_this_runs_own_rows_stored_the_refusal_says_they_are_there(store: Store) -> None:
    fill(store, NEW)  # a run with these very settings wrote 6 rows: there is nothing older to adopt
    spec = FakeSpec(CountingBackend(), NEW)
    with pytest.raises(AdoptionError) as refused:
        adopt(store, spec, role="completions", task="t", across=["backend_version"])
    message = str(refused.value)
    assert f"this run's own descriptor {NEW.hash16()} (t) holds 6 rows" in message
    assert "nothing to adopt" in message and "none is stored" not in message
    with pytest.raises(AdoptionError, match=r"is this run's own descriptor .* --from names the older descriptor"):
        adopt(store, spec, role="completions", task="t", across=["backend_version"], source=NEW.hash16()[:8])
    with Store(Settings(), root=store.root.parent / "empty") as empty, pytest.raises(AdoptionError) as nothing:
        adopt(empty, spec, role="completions", task="t", across=["backend_version"])
    assert "no descriptor of this model and role is stored at all" in str(nothing.value)


def test_adopting_across_task_alone_names_the_task_not_a_second_descriptor(store: Store) -> None:
    fill(store, NEW, task="elsewhere")  # the same settings, stored under another task
    report = adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["task"], sample=4)
    assert report.adopted and report.as_dict()["same_descriptor"] is True
    first, last = report.lines()[0], report.lines()[-1]
    assert first.startswith(
        f"source: the 6 rows of task elsewhere, stored under this run's own descriptor {NEW.hash16()}"
    )
    assert last.startswith(f"adopted 6 rows from task elsewhere into t/{NEW.hash16()}")
    assert "marked adopted_from" not in last  # no second descriptor is implied
    assert last.endswith(
        f"`judgestore delete --role completions --task t --descriptor {NEW.hash16()} --adopted-from {NEW.hash16()}`"
    )


def test_the_command_that_takes_adopted_rows_back_out_leaves_another_descriptors_adoption(store: Store) -> None:
    """It named the source alone: with two descriptors of the task adopted from one source, it deleted both (was)."""
    fill(store, OLD)
    other = NEW.model_copy(update={"sampling": NEW.sampling.model_copy(update={"logprobs": 1})})  # fewer than kept
    for target, across in ((NEW, ["backend_version"]), (other, ["backend_version", "sampling.logprobs"])):
        report = adopt(store, FakeSpec(CountingBackend(), target), role="completions", task="t", across=across,
                       sample=4, source=OLD.hash16())  # fmt: skip
        assert report.adopted, report.lines()
    take_back = report.lines()[-1].rpartition("`judgestore ")[2].rstrip("`")  # the other's, printed last
    result = CliRunner().invoke(app(), [*take_back.split(), "--yes", "--json", "--store-root", str(store.root)])
    assert result.exit_code == 0, result.output
    assert store.database("completions", "t", other).count() == 0
    assert store.database("completions", "t", NEW).count() == 6  # the first adoption stays


def test_an_audit_of_100_percent_adopts_every_row_and_the_next_run_is_all_hits(store: Store) -> None:
    fill(store, OLD)
    backend = CountingBackend()
    report = adopt(store, FakeSpec(backend, NEW), role="completions", task="t", across=["backend_version"], sample=4)
    assert report.met and report.adopted and len(backend.received) == 4  # only the sample was regenerated
    assert (report.counts.source_rows, report.counts.adopted, report.counts.present) == (6, 6, 0)
    assert report.lines()[-1].startswith(f"adopted 6 rows into t/{NEW.hash16()}")
    take_back = (
        f"judgestore delete --role completions --task t --descriptor {NEW.hash16()} --adopted-from {OLD.hash16()}"
    )
    assert report.lines()[-1].endswith(f"`{take_back}`")
    (record,) = adoptions(store.database("completions", "t", NEW))
    assert record.source_descriptor == OLD.sha256() and record.details["across"] == ["backend_version"]
    assert record.details["changes"] == [{"field": "backend_version", "stored": "0.11.0", "wanted": "0.32.0"}]
    assert (record.sampled, record.exact, record.min_exact) == (4, 4, 1.0)

    model = CachedModel(store, NEW, task="t", backend_factory=never)
    model.complete([ask(i) for i in range(6)])
    assert model.last.plan is not None and (model.last.plan.hits, model.last.plan.adopted_hits) == (6, 6)
    assert "6 hits (6 adopted)" in model.last.plan.summary()


def test_adopting_again_is_refused_before_the_audit_and_records_nothing(store: Store) -> None:
    fill(store, OLD)
    adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"])
    target = store.database("completions", "t", NEW)
    store.close()
    before = file_digests(store.root)
    backend = CountingBackend()
    with Store(Settings(), root=store.root) as again, pytest.raises(AdoptionError) as refused:
        adopt(again, FakeSpec(backend, NEW), role="completions", task="t", across=["backend_version"])
    assert "nothing to adopt: every row of" in str(refused.value) and "no engine was loaded" in str(refused.value)
    assert backend.received == [] and file_digests(store.root) == before
    with Store(Settings(), root=store.root, readonly=True) as preview, pytest.raises(AdoptionError) as previewed:
        adopt(preview, FakeSpec(backend, NEW), role="completions", task="t", across=["backend_version"], dry_run=True)
    assert str(previewed.value) == str(refused.value)  # was: an audit, then "would adopt 0 rows", exit 0
    assert backend.received == [] and file_digests(store.root) == before
    assert [a.rows_adopted for a in adoptions(target)] == [6]  # the first adoption only


def test_a_logprob_bound_for_a_run_that_asks_for_no_logprobs_is_refused_before_the_audit(store: Store) -> None:
    """It was said after the engine had regenerated the sample (was)."""
    plain = NEW.model_copy(update={"sampling": NEW.sampling.model_copy(update={"logprobs": None})})
    fill(store, plain.model_copy(update={"backend_version": "0.11.0"}))
    backend = CountingBackend()
    with pytest.raises(InvalidInputError, match="--max-logprob-delta compares first-token logprobs, and this run"):
        adopt(store, FakeSpec(backend, plain), role="completions", task="t", across=["backend_version"],
              max_logprob_delta=0.1, dry_run=True)  # fmt: skip
    assert backend.received == []


@pytest.mark.parametrize(
    ("stored", "asked", "said"),
    [
        ({"logprobs": None}, {}, "asks for 2 top logprobs per position and the rows kept none"),
        ({"logprobs": 1}, {}, "asks for 2 top logprobs per position and the rows kept 1"),
        ({}, {"logprob_positions": "all"}, "every position and the rows kept the first position's"),
    ],
    ids=["none-kept", "fewer-kept", "first-position-kept"],
)
def test_rows_kept_without_the_logprobs_a_run_asks_for_are_never_adopted_for_it(
    store: Store, stored: dict[str, Any], asked: dict[str, Any], said: str
) -> None:
    """The audit compares texts: rows stored without logprobs passed it across sampling.logprobs, and every later
    run asking for logprobs was served rows without them (was)."""
    source = NEW.model_copy(update={"sampling": NEW.sampling.model_copy(update=stored)})
    run = NEW.model_copy(update=asked)
    fill(store, source)
    store.close()
    before = file_digests(store.root)
    backend = CountingBackend()
    with Store(Settings(), root=store.root) as again, pytest.raises(AdoptionError) as refused:
        adopt(again, FakeSpec(backend, run), role="completions", task="t", across=["sampling", "logprob_positions"])
    assert said in str(refused.value) and "no engine was loaded" in str(refused.value)
    assert backend.received == [] and file_digests(store.root) == before
    more = NEW.model_copy(update={"sampling": NEW.sampling.model_copy(update={"logprobs": 5})})
    with Store(Settings(), root=store.root) as again:  # rows that kept more than asked answer it
        fill(again, more, task="u")
        report = adopt(again, FakeSpec(CountingBackend(), NEW), role="completions", task="u", across=["sampling"],
                       sample=2)  # fmt: skip
    assert report.adopted


def test_adopted_rows_are_never_served_for_a_descriptor_that_differs_in_a_field_not_allowed(store: Store) -> None:
    fill(store, OLD)
    adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"])
    backend = CountingBackend()
    hotter_now = NEW.model_copy(update={"sampling": NEW.sampling.model_copy(update={"temperature": 0.7})})
    model = FakeSpec(backend, hotter_now).cached(store, task="t")
    model.complete([ask(i) for i in range(6)])
    assert model.last.plan is not None and (model.last.plan.hits, model.last.plan.adopted_hits) == (0, 0)
    assert len(backend.received) == 6  # generated, never answered from the adopted rows


def filled_with_row_2_edited(store: Store, completion: str) -> None:
    """OLD's rows (:func:`fill`), that of instruction 2 edited by hand to ``completion``: what an audit must catch."""
    fill(store, OLD)
    with closing(sqlite3.connect(store.database("completions", "t", OLD).path)) as conn, conn:
        conn.execute("UPDATE completions SET completion = ? WHERE instruction_id = '2'", (completion,))


def test_an_altered_row_is_refused_named_and_nothing_is_written(store: Store) -> None:
    filled_with_row_2_edited(store, "answer to q2 #7")
    store.close()
    before = file_digests(store.root)
    with Store(Settings(), root=store.root) as again:
        report = adopt(again, FakeSpec(CountingBackend(), NEW), role="completions", task="t",
                       across=["backend_version"], sample=6)  # fmt: skip
    assert not report.met and not report.adopted and report.record is None
    (mismatch,) = report.audit.mismatches
    assert mismatch.instruction_id == "2" and mismatch.first_difference == len("answer to q2 #")
    assert "refused: the exact-match rate 83.3% is under --min-exact 100.0%" in report.lines()[-1]
    assert any(line.strip().startswith(mismatch.input_hash[:16]) for line in report.lines())
    assert file_digests(store.root) == before


def test_a_lower_minimum_adopts_all_but_the_sampled_rows_that_differed(store: Store) -> None:
    filled_with_row_2_edited(store, "edited")
    report = adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"],
                   sample=6, min_exact=0.8)  # fmt: skip
    assert report.adopted and (report.counts.adopted, report.counts.excluded) == (5, 1)
    adopted = {r.instruction_id for r in store.database("completions", "t", NEW).query()}
    assert adopted == {"0", "1", "3", "4", "5"}


def test_a_row_an_earlier_audit_found_different_is_never_adopted_by_a_later_one(store: Store) -> None:
    """Was: a second adopt (another sample, which missed the edited row) adopted it, and runs served it as a hit."""
    filled_with_row_2_edited(store, "edited")
    first = adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"],
                  sample=6, min_exact=0.8)  # fmt: skip
    assert first.adopted and first.counts.excluded == 1
    with pytest.raises(AdoptionError, match=r"left out by an earlier audit that found it different \(1\)"):
        adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"],
              sample=1, seed=1)  # fmt: skip
    store.database("completions", "t", NEW).delete(RowFilter(instruction_id="4"))  # one row to adopt again
    again = adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"],
                  sample=2, min_exact=0.5)  # fmt: skip
    assert again.adopted and (again.counts.adopted, again.counts.excluded) == (1, 1)
    assert "edited" not in {r.completion for r in store.database("completions", "t", NEW).query()}


def test_a_source_whose_rows_cannot_be_read_is_named_with_what_it_met(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: "no stored descriptor ... differs only in the allowed fields", the reason buried in the listing. One
    whose descriptor cannot be read either is only listed: what it differs in is not known."""
    fill(store, OLD)
    path = store.database("completions", "t", OLD).path
    store.close()

    def unreadable(database: Database, *_: Any) -> int:  # its descriptor reads; its rows do not (a damaged page)
        raise CorruptDatabaseError(database.where, "database disk image is malformed")

    with monkeypatch.context() as patched, Store(Settings(), root=store.root) as again:
        patched.setattr(Database, "count", unreadable)
        with pytest.raises(AdoptionError) as refused:
            adopt(again, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"])
    said = str(refused.value)
    assert said.startswith(f"descriptor {OLD.hash16()} (t) differs from this run only in the allowed fields, but "
                           "its rows cannot be read: ") and "malformed" in said  # fmt: skip
    with closing(sqlite3.connect(path)) as conn, conn:  # behind the schema head: its metadata.json still reads
        conn.execute("UPDATE judgestore_alembic_version SET version_num = '0005'")
    with Store(Settings(), root=store.root) as again, pytest.raises(AdoptionError) as refused:
        adopt(again, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"])
    said = str(refused.value)  # was "no stored descriptor ... differs only in the allowed fields"
    assert said.startswith(f"descriptor {OLD.hash16()} (t) differs from this run only in the allowed fields, but "
                           "its rows cannot be read: ") and "judgestore db upgrade" in said  # fmt: skip
    metadata = path.parent / "metadata.json"
    metadata.write_text(metadata.read_text().replace('"0.11.0"', '"0.11.1"'))  # edited: its descriptor is not known
    with Store(Settings(), root=store.root) as again, pytest.raises(AdoptionError) as refused:
        adopt(again, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"])
    said = str(refused.value)
    assert said.startswith("no stored descriptor") and f"{OLD.hash16()} (t, unreadable: " in said


@pytest.mark.postgres
def test_a_server_store_adopts_as_a_folder_does(pg_url: str) -> None:
    """Was: the source's descriptor was read from a metadata.json file, which a server store has none of."""
    with Store(Settings(), url=pg_url) as server:
        fill(server, OLD)
        report = adopt(server, FakeSpec(CountingBackend(), NEW), role="completions", task="t",
                       across=["backend_version"], sample=6)  # fmt: skip
        assert report.adopted and report.counts.adopted == 6
        assert report.record is not None and report.record.source_descriptor == OLD.sha256()
        assert server.database("completions", "t", NEW).count() == 6


def test_a_dry_run_writes_nothing_and_says_what_it_would_adopt(store: Store) -> None:
    fill(store, OLD)
    store.close()
    before = file_digests(store.root)
    with Store(Settings(), root=store.root, readonly=True) as readonly:
        report = adopt(readonly, FakeSpec(CountingBackend(), NEW), role="completions", task="t",
                       across=["backend_version"], dry_run=True)  # fmt: skip
        with pytest.raises(InvalidInputError, match="open the store writable"):
            adopt(readonly, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"])
    assert report.met and not report.adopted and report.counts.adopted == 6
    assert report.lines()[-1].startswith("dry run: would adopt 6 rows")
    assert file_digests(store.root) == before


def test_judgements_meet_a_logprob_bound_only_when_logprobs_can_be_compared(store: Store) -> None:
    fill(store, OLD)
    spec = FakeSpec(CountingBackend(), NEW)
    kept = adopt(store, spec, role="judgements", task="t", across=["backend_version"], max_logprob_delta=0.01,
                 dry_run=True)  # fmt: skip
    assert kept.met and kept.audit.max_abs_logprob_delta == 0.0
    source = store.database("judgements", "t", OLD)
    with closing(sqlite3.connect(source.path)) as conn, conn:  # a candidate the engine no longer lists
        (key,) = conn.execute("SELECT input_hash FROM judgements ORDER BY input_hash LIMIT 1").fetchone()
        conn.execute("UPDATE judgements SET top_logprobs = '{\"x\": -0.5, \"gone\": -0.2}' WHERE input_hash = ?",
                     (key,))  # fmt: skip
    moved = adopt(store, spec, role="judgements", task="t", across=["backend_version"], max_logprob_delta=0.01,
                  dry_run=True)  # fmt: skip
    assert not moved.met and moved.audit.max_abs_logprob_delta == pytest.approx(0.3)  # was: met, 0.0
    assert f"in 1 sampled rows: {key[:16]} (?/?, sample 0) 'gone' -0.3" in moved.unmet[0]  # was: no row named
    with closing(sqlite3.connect(source.path)) as conn, conn:
        conn.execute("UPDATE judgements SET top_logprobs = NULL")
    unchecked = adopt(store, spec, role="judgements", task="t", across=["backend_version"], max_logprob_delta=0.01)
    assert not unchecked.met and "cannot be checked" in unchecked.unmet[0]
    assert store.find("judgements", "t", NEW) is None


@pytest.mark.parametrize(
    "thresholds",
    [{"min_exact": float("nan")}, {"min_exact": 1.5}, {"max_logprob_delta": float("nan")}, {"max_logprob_delta": -1.0}],
    ids=["min_exact-nan", "min_exact-above-1", "delta-nan", "delta-negative"],
)
def test_a_threshold_that_no_audit_could_be_held_to_is_refused_before_anything(
    store: Store, thresholds: dict[str, float]
) -> None:
    """A NaN bound compares false with everything: max_logprob_delta=NaN used to pass any audit."""
    fill(store, OLD)
    before = file_digests(store.root)
    backend = CountingBackend()
    with pytest.raises(InvalidInputError, match="max_logprob_delta >= 0"):
        adopt(store, FakeSpec(backend, NEW), role="judgements", task="t", across=["backend_version"], **thresholds)
    assert file_digests(store.root) == before and store.find("judgements", "t", NEW) is None
    assert backend.received == []  # no engine was asked


def test_the_command_line_rebuilds_the_spec_it_was_made_from(tiny_model_dir: Path) -> None:
    spec = ModelSpec(
        model=str(tiny_model_dir),
        label="tiny",
        input_mode="text",
        sampling={"temperature": 0.0, "max_tokens": 8, "top_p": 0.95, "logprobs": 3, "stop": ["\n"]},
        engine_kwargs={"dtype": "float32", "max_model_len": 256, "seed": 0, "quantization": "true"},
        chat_template_kwargs={"style": "short"},
        enable_thinking=False,
        logprob_positions="all",
    )
    built: list[Any] = []
    app = typer.Typer()
    app.command()(grouped(spec=model_spec)(lambda spec: built.append(spec)))
    result = CliRunner().invoke(app, spec_options(spec))
    assert result.exit_code == 0, result.output
    assert built[0].descriptor == spec.descriptor and built[0].display_name == "tiny"
    command = adopt_command_line(spec, role="judgements", task="mt bench", source="0123abcd")
    assert command.startswith("judgestore adopt --model ")
    assert command.endswith("--task 'mt bench' --role judgements --from 0123abcd --across backend_version")


@pytest.mark.parametrize(
    ("command", "option", "value", "said"),
    [
        ("audit", "--fail-under", "nan", "nan is not a share from 0 to 1"),
        ("audit", "--fail-under", "1.5", "1.5 is not a share from 0 to 1"),
        ("audit", "--fail-under", "most", "'most' is not a number"),
        ("adopt", "--min-exact", "nan", "nan is not a share from 0 to 1"),
        ("adopt", "--max-logprob-delta", "nan", "nan is not a number of 0 or more"),
        ("adopt", "--max-logprob-delta", "-0.5", "-0.5 is not a number of 0 or more"),
        ("adopt", "--across", "bogus", "'bogus': not a descriptor field"),  # was exit 1, after opening the store
    ],
)
def test_a_threshold_option_says_what_it_takes(
    tmp_path: Path, command: str, option: str, value: str, said: str
) -> None:
    """Was: 'Input should be less than or equal to 1' for NaN, and --max-logprob-delta nan let through."""
    args = [command, "--model", str(tmp_path / "model"), "--task", "t", "--store-root", str(tmp_path / "store")]
    result = CliRunner().invoke(app(), [*args, *(["--across", "backend_version"] if command == "adopt" else [])
                                              , option, value])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': {said}" in " ".join(result.stderr.split())
    assert not (tmp_path / "store").exists()


def test_a_source_named_twice_is_a_usage_error(tmp_path: Path) -> None:
    """`--from A --from B` adopted from B, the last given (was): what a command acts on is given once."""
    args = ["adopt", "--model", str(tmp_path / "model"), "--task", "t", "--store-root", str(tmp_path / "store"),
            "--across", "backend_version", "--from", "aaaa", "--from", "bbbb"]  # fmt: skip
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--from': given 2 times; it takes one value" in " ".join(result.stderr.split())
    assert not (tmp_path / "store").exists()


def test_an_adoption_interrupted_while_copying_leaves_no_row_and_no_record(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C just after the rows went in, before the adoption was recorded: one transaction, so neither stays
    (what `judgestore adopt` says on Ctrl-C: nothing was adopted)."""
    from store.backends.sqlite.rows import SqliteRepository

    fill(store, OLD)
    real_put = SqliteRepository.put_many
    put: list[int] = []

    def put_then_ctrl_c(self: SqliteRepository, records: Any, on_conflict: Any = "ignore") -> int:
        put.append(real_put(self, records, on_conflict))
        raise KeyboardInterrupt

    monkeypatch.setattr(SqliteRepository, "put_many", put_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        adopt(store, FakeSpec(CountingBackend(), NEW), role="completions", task="t", across=["backend_version"])
    assert put == [6]  # the rows were written in the transaction, then rolled back with it
    own = store.find("completions", "t", NEW)
    assert own is None or (own.count() == 0 and adoptions(own) == [])
