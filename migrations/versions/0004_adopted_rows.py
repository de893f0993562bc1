"""Adopted rows: a column marking rows copied from an older descriptor, and the adoptions table.

What changes: adds the nullable column ``adopted_from`` (String(64)) to
``completions`` and ``judgements``, each with a partial index over the rows
where it is set (``ix_{table}_adopted_from``), and the table ``adoptions``
(one row per ``judgestore adopt`` into this database: the source descriptor's
full hash and task, the fields allowed to differ and how they differed, the
audit figures and the thresholds, the rows adopted, already present and left
out, who and when) with an index on ``source_descriptor``.
Why: issue 15. ``judgestore adopt`` carries a cache across an engine upgrade
after an audit, and must never do so silently: every adopted row says where
it came from (``query``/``stats``/``verify`` show it, ``delete
--adopted-from HASH`` takes the rows back out), plans count adopted hits
apart, and the evidence is kept beside the rows. It is kept in the database,
not in metadata.json, whose bytes must stay those of its descriptor (sharing
checks them byte for byte).
Data impact: none; existing rows read NULL (not adopted), no row is
rewritten, the new table starts empty.
Expected cost: milliseconds per database: SQLite adds a nullable column in
place (no table copy), the partial indexes are built over no rows, and one
CREATE TABLE.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 15:25:01.385755
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "adoptions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source_descriptor", sa.String(length=64), nullable=False),
        sa.Column("source_task", sa.String(), nullable=False),
        sa.Column("source_rows", sa.Integer(), nullable=False),
        sa.Column("details", sa.JSON(none_as_null=True), nullable=False),
        sa.Column("sampled", sa.Integer(), nullable=False),
        sa.Column("exact", sa.Integer(), nullable=False),
        sa.Column("max_abs_logprob_delta", sa.Float(), nullable=True),
        sa.Column("top_tokens_changed", sa.Integer(), nullable=False),
        sa.Column("sample_seed", sa.Integer(), nullable=True),
        sa.Column("min_exact", sa.Float(), nullable=False),
        sa.Column("max_logprob_delta", sa.Float(), nullable=True),
        sa.Column("rows_adopted", sa.Integer(), nullable=False),
        sa.Column("rows_present", sa.Integer(), nullable=False),
        sa.Column("rows_excluded", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("created_by", sa.String(), nullable=True),
        sa.Column("adopted_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adoptions")),
    )
    with op.batch_alter_table("adoptions", schema=None) as batch_op:
        batch_op.create_index("ix_adoptions_source_descriptor", ["source_descriptor"], unique=False)

    with op.batch_alter_table("completions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("adopted_from", sa.String(length=64), nullable=True))
        batch_op.create_index(
            "ix_completions_adopted_from",
            ["adopted_from"],
            unique=False,
            sqlite_where=sa.text("adopted_from IS NOT NULL"),
            postgresql_where=sa.text("adopted_from IS NOT NULL"),
        )

    with op.batch_alter_table("judgements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("adopted_from", sa.String(length=64), nullable=True))
        batch_op.create_index(
            "ix_judgements_adopted_from",
            ["adopted_from"],
            unique=False,
            sqlite_where=sa.text("adopted_from IS NOT NULL"),
            postgresql_where=sa.text("adopted_from IS NOT NULL"),
        )


def downgrade() -> None:
    raise NotImplementedError(
        "judgestore migrations are forward-only; restore the backup that `judgestore db upgrade` kept"
    )
