"""Run and adoption counts hold 64 bits on PostgreSQL, as they always did on SQLite.

What changes: nothing on SQLite (its INTEGER holds 64 bits). On PostgreSQL,
every count and token total of ``runs`` (``requested``, ``distinct_inputs``,
``hits``, ``misses``, ``duplicates``, ``generated``, ``rows_written``,
``truncated``, ``prompt_tokens``, ``completion_tokens``,
``saved_prompt_tokens``, ``saved_completion_tokens``,
``hits_without_cost``) and of ``adoptions`` (``source_rows``, ``sampled``,
``exact``, ``top_tokens_changed``, ``sample_seed``, ``rows_adopted``,
``rows_present``, ``rows_excluded``) goes from ``integer`` to ``bigint``.
Why: a call of a million prompts of 2,200 tokens spends more than
``integer`` holds (2**31 - 1): its run was refused after its rows were
stored, so the call failed, and every rerun failed again on its saved
tokens; a copy of such a store from SQLite to PostgreSQL was refused.
Data impact: none; every value is kept (a wider type), and row ids stay as
they are.
Expected cost: on SQLite nothing. On PostgreSQL one rewrite of ``runs`` and
one of ``adoptions`` (one row per call or adoption: milliseconds for
thousands); ``completions`` and ``judgements`` are not touched. A view of
the user's own over these columns stops it (PostgreSQL changes no column
type a view reads; the upgrade is rolled back and says so): drop the view,
upgrade, and create it again.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WIDENED = {
    "runs": (
        "requested", "distinct_inputs", "hits", "misses", "duplicates", "generated", "rows_written", "truncated",
        "prompt_tokens", "completion_tokens", "saved_prompt_tokens", "saved_completion_tokens", "hits_without_cost",
    ),
    "adoptions": (
        "source_rows", "sampled", "exact", "top_tokens_changed", "sample_seed", "rows_adopted", "rows_present",
        "rows_excluded",
    ),
}  # fmt: skip


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite's INTEGER holds 64 bits already
    for table, columns in _WIDENED.items():  # one statement a table: one rewrite of it, not one a column
        op.execute(sa.text(f"ALTER TABLE {table} " + ", ".join(f"ALTER COLUMN {c} TYPE bigint" for c in columns)))


def downgrade() -> None:
    raise NotImplementedError(
        "judgestore migrations are forward-only; restore the backup that `judgestore db upgrade` kept"
    )
