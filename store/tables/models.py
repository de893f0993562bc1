"""The tables: typed declarative models for completions and judgements.

Contract:

* ``input_hash`` (the content address, see :mod:`store.descriptor`) is the
  primary key; the typed metadata columns are for inspection and targeted
  deletion and are never part of the key.
* Small metadata columns come before the large text columns (filtered
  metadata queries read fewer overflow pages).
* ``created_at`` is stored in UTC and read back as an aware UTC datetime.
* JSON columns store SQL NULL for Python ``None`` (``none_as_null``).
* Every text column keeps any text, U+0000 included, on every backend: on
  PostgreSQL its values are escaped (:func:`store.backends.postgres.text.server_safe`; the
  JSON columns are escaped by the engine's serializer). The two hash columns
  (``input_hash``, ``adopted_from``) hold hex digests, checked on write, and
  are plain.
* Every constraint and index is named by the naming convention, so migrations
  can refer to them on every backend.
* ``runs`` (:class:`Run`) is the accounting of the calls that used a
  database: what was asked, what the store answered, what the engine cost and
  what the hits saved. It is bookkeeping beside the rows, never part of them.
* ``adopted_from`` is NULL for rows this descriptor's engine produced (or
  that were imported); a row copied in from an older descriptor by
  ``judgestore adopt`` holds that descriptor's full SHA-256 there, and
  ``adoptions`` (:class:`Adoption`) records each adoption: the source, the
  fields allowed to differ, the audit that justified it, the thresholds.
* ``claims`` (:class:`Claim`) is the work queue of shared batches
  (:mod:`store.claims`): one row per input some job leased to generate, with
  the lease's holder and deadline. It is bookkeeping beside the rows, never
  part of a row or its key: a claim left behind is harmless (an input whose
  row is stored is never claimed again) and is swept.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, get_args

from sqlalchemy import JSON, BigInteger, CheckConstraint, DateTime, Float, Index, Integer, MetaData, String, Text, text
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from store.backends.postgres.text import server_safe

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


Orientation = Literal["direct", "reversed"]  # relative to the source pair (see Judgement)
ORIENTATIONS: tuple[Orientation, ...] = get_args(Orientation)
SUMMED = {"summed": True}  # a runs column that RunTotals adds up over a database's runs
# A count or token total a run or an adoption records: a call of a million prompts of 2,200 tokens spends more than
# PostgreSQL's integer holds (2**31 - 1), so its run was refused after its rows were stored (was). SQLite's INTEGER
# holds 64 bits already: its schema stays as it was.
COUNT = BigInteger().with_variant(Integer(), "sqlite")
FILLED_BY_THE_DATABASE = {"record_default": None}  # a record yet to be written leaves it out (an id, say)
FILLED_WHEN_WRITTEN = {"record_default": None}  # set by the code that writes the row (store.adoption)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out; naive input is refused."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"created_at must be timezone-aware, got naive {value!r}")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


# The revision whose schema these models declare: a new database at this head is created from them
# (store.schema.head_statements). tests/store/test_migrations.py holds it equal to the scripts' head and the
# schema the scripts build equal to the models'; a new revision moves it (docs/schema-evolution.md).
SCHEMA_REVISION = "0007"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(none_as_null=True),
    }


class _Row:
    """Columns shared by both tables, in storage order (sort_order)."""

    input_hash: Mapped[str] = mapped_column(String(64), primary_key=True, sort_order=-100)
    sample_index: Mapped[int] = mapped_column(Integer, default=0, sort_order=-99)
    # Deferred: a cache hit returns the answer (completion, finish reason, usage, logprobs), never the prompt (2-8 KB)
    # nor the row's bookkeeping, so the lookup leaves those out (store.tables.deferred).
    benchmark: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=-90, info={"deferred": True})
    instruction_id: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=-89, info={"deferred": True})
    finish_reason: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=10)
    run_id: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=11, info={"deferred": True})
    created_by: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=12, info={"deferred": True})
    created_at: Mapped[datetime] = mapped_column(sort_order=13, info={"deferred": True})
    usage: Mapped[dict[str, Any] | None] = mapped_column(sort_order=20)
    top_logprobs: Mapped[dict[str, Any] | None] = mapped_column(sort_order=21)
    input_text: Mapped[str] = mapped_column(server_safe(Text()), sort_order=30, info={"deferred": True})
    completion: Mapped[str] = mapped_column(server_safe(Text()), sort_order=31)
    # Last, where revision 0004 added it in place (SQLite appends columns); NULL: not adopted.
    adopted_from: Mapped[str | None] = mapped_column(String(64), sort_order=40)


ADOPTED = text("adopted_from IS NOT NULL")


def _row_constraints(table: str) -> tuple[Any, ...]:
    """Constraints and indexes both tables share (the queries users run)."""
    return (
        CheckConstraint("sample_index >= 0", name="sample_index_nonnegative"),
        Index(f"ix_{table}_benchmark_instruction_id", "benchmark", "instruction_id"),
        Index(f"ix_{table}_run_id", "run_id"),
        Index(f"ix_{table}_created_at", "created_at"),
        # Partial: rows that were not adopted (nearly all) cost the index nothing on write. Revision 0004 builds
        # it on PostgreSQL too (postgresql_where); naming that option here would load the PostgreSQL dialect in
        # every process, ~40 ms of every command's start, so a server's new schema gets it from
        # store.schema._declared, where that dialect is loaded anyway.
        Index(f"ix_{table}_adopted_from", "adopted_from", sqlite_where=ADOPTED),
    )


class Completion(_Row, Base):
    """One generated completion of one rendered input (sample ``sample_index``)."""

    __tablename__ = "completions"

    model: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=-80)

    __table_args__ = (*_row_constraints("completions"), Index("ix_completions_model", "model"))


class Judgement(_Row, Base):
    """One judge completion; ``model_b`` is NULL for pointwise judgements.

    ``model_a``/``model_b`` are the *positional slots* of the rendered judge
    prompt (JudgeArena #128): ``model_a`` is the model whose answer is shown
    first. ``orientation`` relates that order to the source pair (X, Y):
    ``direct`` shows X first (``model_a = X``), ``reversed`` shows Y first
    (``model_a = Y``). Native and imported rows carry this one meaning (rows
    judgestore 0.1.0 wrote with the pair's identity are converted by migration
    0002). Every judgement of the pair (X, Y), both orientations::

        select(Judgement).where(
            or_(and_(Judgement.model_a == X, Judgement.model_b == Y),
                and_(Judgement.model_a == Y, Judgement.model_b == X)))
    """

    __tablename__ = "judgements"

    model_a: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=-80)
    model_b: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=-79)
    judge: Mapped[str | None] = mapped_column(server_safe(String()), sort_order=-78)
    orientation: Mapped[Orientation | None] = mapped_column(server_safe(String(16)), sort_order=-77)

    __table_args__ = (
        *_row_constraints("judgements"),
        CheckConstraint("orientation IS NULL OR orientation IN ('direct', 'reversed')", name="orientation_valid"),
        Index("ix_judgements_model_a", "model_a"),
        Index("ix_judgements_model_b", "model_b"),
        Index("ix_judgements_judge", "judge"),
    )


class Run(Base):
    """One call of the cache boundary that used this database (``CachedModel.complete``/``judge``).

    Counts are over (request, sample) slots (``requested``) and distinct keys
    (the rest), as in the plan a run prints. ``prompt_tokens``,
    ``completion_tokens`` and ``engine_seconds`` are what the engine spent on
    the misses; the ``saved_*`` columns add up what the hit rows had cost when
    they were generated (their ``usage``), and ``hits_without_cost`` counts
    hits whose row records no engine time (rows written before revision 0003 or
    imported), which ``saved_engine_seconds`` therefore leaves out.
    """

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, info=FILLED_BY_THE_DATABASE)
    role: Mapped[str] = mapped_column(server_safe(String(16)))
    run_id: Mapped[str | None] = mapped_column(server_safe(String()))
    created_by: Mapped[str | None] = mapped_column(server_safe(String()))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    mode: Mapped[str] = mapped_column(server_safe(String(16)))
    requested: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    distinct_inputs: Mapped[int] = mapped_column(COUNT)
    hits: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    misses: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    duplicates: Mapped[int] = mapped_column(COUNT)
    generated: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    rows_written: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    truncated: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    prompt_tokens: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    completion_tokens: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    engine_seconds: Mapped[float] = mapped_column(Float, info=SUMMED)
    saved_prompt_tokens: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    saved_completion_tokens: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    saved_engine_seconds: Mapped[float] = mapped_column(Float, info=SUMMED)
    hits_without_cost: Mapped[int] = mapped_column(COUNT, info=SUMMED)
    wall_seconds: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        CheckConstraint("role IN ('completions', 'judgements')", name="role_valid"),
        Index("ix_runs_started_at", "started_at"),
        Index("ix_runs_run_id", "run_id"),
    )


class Adoption(Base):
    """One ``judgestore adopt`` into this database: rows of an older descriptor, copied after an audit.

    ``source_descriptor`` is the full SHA-256 of the descriptor the rows were
    copied from (what the rows' ``adopted_from`` holds); ``details`` holds
    the fields that were allowed to differ (``across``), how they differed
    (``changes``: field, stored, wanted), the source folder's assumptions and
    the sampled rows that differed (never copied). The audit figures and the
    thresholds they met are columns. It is the history of adoptions: rows
    deleted later (``judgestore delete --adopted-from``) leave it as it was.
    """

    __tablename__ = "adoptions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, info=FILLED_BY_THE_DATABASE)
    source_descriptor: Mapped[str] = mapped_column(String(64))
    source_task: Mapped[str] = mapped_column(server_safe(String()))
    source_rows: Mapped[int] = mapped_column(COUNT)
    details: Mapped[dict[str, Any]]
    sampled: Mapped[int] = mapped_column(COUNT)
    exact: Mapped[int] = mapped_column(COUNT)
    max_abs_logprob_delta: Mapped[float | None] = mapped_column(Float)
    top_tokens_changed: Mapped[int] = mapped_column(COUNT)
    sample_seed: Mapped[int | None] = mapped_column(COUNT)
    min_exact: Mapped[float] = mapped_column(Float)
    max_logprob_delta: Mapped[float | None] = mapped_column(Float)
    rows_adopted: Mapped[int] = mapped_column(COUNT, default=0)
    rows_present: Mapped[int] = mapped_column(COUNT, default=0)
    rows_excluded: Mapped[int] = mapped_column(COUNT, default=0)
    run_id: Mapped[str | None] = mapped_column(server_safe(String()), info=FILLED_WHEN_WRITTEN)
    created_by: Mapped[str | None] = mapped_column(server_safe(String()), info=FILLED_WHEN_WRITTEN)
    adopted_at: Mapped[datetime] = mapped_column(info=FILLED_WHEN_WRITTEN)

    __table_args__ = (Index("ix_adoptions_source_descriptor", "source_descriptor"),)


class Claim(Base):
    """One input of a shared batch that a job leased to generate (:mod:`store.claims`); never part of a row.

    ``holder`` is the job holding the lease until ``deadline`` (renewed while
    it works); NULL with a NULL deadline: enqueued, nobody holds it yet. A
    lease past its deadline is stale: its holder died or stalled, and any job
    may take the input over (``attempts`` counts the leases taken). ``failed``
    is the error of a holder whose generation failed (never stored, like any
    failure); the other jobs of the batch report it until the lease ends.
    ``position`` is the input's place in the batch that enqueued it: blocks
    are claimed in the caller's order.
    """

    __tablename__ = "claims"

    input_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    holder: Mapped[str | None] = mapped_column(server_safe(String()))
    deadline: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[str | None] = mapped_column(server_safe(Text()))
    updated_at: Mapped[datetime]

    __table_args__ = (Index("ix_claims_position", "position"), Index("ix_claims_deadline", "deadline"))


MODEL_OF_ROLE: dict[str, type[Completion] | type[Judgement]] = {
    "completions": Completion,
    "judgements": Judgement,
}
