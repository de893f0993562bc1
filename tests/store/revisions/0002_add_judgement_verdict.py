"""Synthetic test revision: add a nullable ``verdict`` column to ``judgements``.

What changes: one nullable column; every existing row gets NULL there.
Why: the schema tests need a revision after 0001 to upgrade databases to.
Data impact: none (no row is rewritten, no row is dropped).
Expected cost: milliseconds per database (SQLite adds a nullable column in place).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("judgements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("verdict", sa.String(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("test revision: forward-only")
