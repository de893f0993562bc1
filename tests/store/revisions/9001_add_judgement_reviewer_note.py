"""Synthetic test revision: add a nullable ``reviewer_note`` column to ``judgements``.

Not ``verdict``, the column docs/schema-evolution.md's worked example adds: a project that ships that example
keeps passing these tests.

What changes: one nullable column; every existing row gets NULL there.
Why: the schema tests need a revision after the shipped head to upgrade databases to.
Data impact: none (no row is rewritten, no row is dropped).
Expected cost: milliseconds per database (SQLite adds a nullable column in place).

Revision ID: 9001
Revises: (the shipped head, found when the file is read)
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

import migrations

# Always on top of the newest shipped revision, so adding a real one never breaks the schema tests.
_SHIPPED = sorted(p.name.split("_", 1)[0] for p in (Path(migrations.__file__).parent / "versions").glob("[0-9]*_*.py"))

revision: str = "9001"
down_revision: str | None = _SHIPPED[-1]
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("judgements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reviewer_note", sa.String(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError("test revision: forward-only")
