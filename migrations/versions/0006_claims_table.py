"""The claims table: the work queue of shared batches (``--shared-batch``).

What changes: adds the table ``claims`` (one row per input a job of a shared
batch enqueued or leased: ``input_hash``, its ``position`` in the batch, the
lease's ``holder`` and ``deadline``, ``attempts``, the ``failed`` error of a
holder whose generation failed, ``updated_at``) with indexes on
``position`` and ``deadline``.
Why: issue 25. Jobs started on one batch share the work through the store:
each claims misses in blocks (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite:
under the database's write lock) and generates only what it claimed. The
claims are bookkeeping beside the rows, never part of a row or its key.
Data impact: none; ``completions``, ``judgements``, ``runs`` and
``adoptions`` are not touched, and the new table starts empty. A claim left
behind is harmless and swept.
Expected cost: milliseconds per database (one CREATE TABLE, two CREATE
INDEX on an empty table).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column("input_hash", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(), nullable=True),
        sa.Column("deadline", sa.DateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("input_hash", name=op.f("pk_claims")),
    )
    with op.batch_alter_table("claims", schema=None) as batch_op:
        batch_op.create_index("ix_claims_deadline", ["deadline"], unique=False)
        batch_op.create_index("ix_claims_position", ["position"], unique=False)


def downgrade() -> None:
    raise NotImplementedError(
        "judgestore migrations are forward-only; restore the backup that `judgestore db upgrade` kept"
    )
