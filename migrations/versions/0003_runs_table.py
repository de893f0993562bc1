"""The runs table: per-database accounting of the calls that used it.

What changes: adds the table ``runs`` (one row per call of the cache
boundary on this database: mode, requested/distinct/hits/misses/duplicates,
rows written, truncated outputs, the tokens and engine seconds the misses
cost, the tokens and engine seconds the hits saved, wall time, run id, user,
start and finish times) with indexes on ``started_at`` and ``run_id``.
Why: `judgestore stats` and each run summary say what the cache saved
(issue 12); that history is kept beside the rows it is about, so it travels
with the database and is pruned with it.
Data impact: none; ``completions`` and ``judgements`` are not touched, and
the new table starts empty (runs before the upgrade were not recorded).
Expected cost: milliseconds per database (one CREATE TABLE, two CREATE
INDEX on an empty table).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 14:47:56.547557
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("created_by", sa.String(), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("requested", sa.Integer(), nullable=False),
        sa.Column("distinct_inputs", sa.Integer(), nullable=False),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.Column("misses", sa.Integer(), nullable=False),
        sa.Column("duplicates", sa.Integer(), nullable=False),
        sa.Column("generated", sa.Integer(), nullable=False),
        sa.Column("rows_written", sa.Integer(), nullable=False),
        sa.Column("truncated", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("engine_seconds", sa.Float(), nullable=False),
        sa.Column("saved_prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("saved_completion_tokens", sa.Integer(), nullable=False),
        sa.Column("saved_engine_seconds", sa.Float(), nullable=False),
        sa.Column("hits_without_cost", sa.Integer(), nullable=False),
        sa.Column("wall_seconds", sa.Float(), nullable=False),
        sa.CheckConstraint("role IN ('completions', 'judgements')", name=op.f("ck_runs_role_valid")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_run_id", ["run_id"], unique=False)
        batch_op.create_index("ix_runs_started_at", ["started_at"], unique=False)


def downgrade() -> None:
    raise NotImplementedError(
        "judgestore migrations are forward-only; restore the backup that `judgestore db upgrade` kept"
    )
