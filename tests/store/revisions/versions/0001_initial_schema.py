"""Initial schema: the completions and judgements tables.

What changes: creates ``completions`` and ``judgements`` (content-addressed by
``input_hash``; typed metadata columns before the large text columns), their
named check constraints and the indexes the usual queries use
(benchmark/instruction, model, model_a/model_b/judge, run_id, created_at).
Every descriptor database holds both tables; its role decides which is used.
Why: first revision.
Data impact: none (new tables).
Expected cost: milliseconds per database.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "completions",
        sa.Column("input_hash", sa.String(length=64), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("benchmark", sa.String(), nullable=True),
        sa.Column("instruction_id", sa.String(), nullable=True),
        sa.Column("model", sa.String(), nullable=True),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("created_by", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("usage", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("top_logprobs", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("input_text", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.CheckConstraint("sample_index >= 0", name=op.f("ck_completions_sample_index_nonnegative")),
        sa.PrimaryKeyConstraint("input_hash", name=op.f("pk_completions")),
    )
    with op.batch_alter_table("completions", schema=None) as batch_op:
        batch_op.create_index("ix_completions_benchmark_instruction_id", ["benchmark", "instruction_id"], unique=False)
        batch_op.create_index("ix_completions_created_at", ["created_at"], unique=False)
        batch_op.create_index("ix_completions_model", ["model"], unique=False)
        batch_op.create_index("ix_completions_run_id", ["run_id"], unique=False)

    op.create_table(
        "judgements",
        sa.Column("input_hash", sa.String(length=64), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("benchmark", sa.String(), nullable=True),
        sa.Column("instruction_id", sa.String(), nullable=True),
        sa.Column("model_a", sa.String(), nullable=True),
        sa.Column("model_b", sa.String(), nullable=True),
        sa.Column("judge", sa.String(), nullable=True),
        sa.Column("orientation", sa.String(length=16), nullable=True),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("created_by", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("usage", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("top_logprobs", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("input_text", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "orientation IS NULL OR orientation IN ('direct', 'reversed')", name=op.f("ck_judgements_orientation_valid")
        ),
        sa.CheckConstraint("sample_index >= 0", name=op.f("ck_judgements_sample_index_nonnegative")),
        sa.PrimaryKeyConstraint("input_hash", name=op.f("pk_judgements")),
    )
    with op.batch_alter_table("judgements", schema=None) as batch_op:
        batch_op.create_index("ix_judgements_benchmark_instruction_id", ["benchmark", "instruction_id"], unique=False)
        batch_op.create_index("ix_judgements_created_at", ["created_at"], unique=False)
        batch_op.create_index("ix_judgements_judge", ["judge"], unique=False)
        batch_op.create_index("ix_judgements_model_a", ["model_a"], unique=False)
        batch_op.create_index("ix_judgements_model_b", ["model_b"], unique=False)
        batch_op.create_index("ix_judgements_run_id", ["run_id"], unique=False)


def downgrade() -> None:
    raise NotImplementedError(
        "judgestore migrations are forward-only; restore the backup that `judgestore db upgrade` kept"
    )
