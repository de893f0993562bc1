"""Judge slots become positional: ``model_a`` is the model whose answer the judge prompt shows first.

What changes: no table or index changes. In ``judgements``, the ``reversed``
rows that judgestore 0.1.0's default judge prompt wrote (their rendered input
starts with that prompt's system message) get ``model_a`` and ``model_b``
swapped. 0.1.0 kept the pair's identity in both orientations; JudgeArena
#128, imported legacy rows and judgestore from 0.2.0 on record the positional
slots of the rendered prompt, with ``orientation`` relative to the source
pair. Rows of any other prompt (messages the caller rendered, imported
caches) are left exactly as they were written.
Why: one meaning of ``model_a``/``model_b`` per table, so that
``--model-a X --orientation reversed`` selects the same rows for native and
imported judgements.
Data impact: ``model_a``/``model_b`` of those rows only; the row count, the
input hashes (the keys) and every other column are unchanged.
Expected cost: one UPDATE per database, a scan of ``judgements``
(milliseconds per thousand rows).

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

# Frozen here on purpose: a migration must not change when the library's prompts do.
# The canonical rendered input of 0.1.0's judge prompt begins with exactly these characters.
_V0_1_SYSTEM_MESSAGE = (
    '{"messages":[{"content":"You are an impartial judge. Compare the two answers to the user\'s question. '
    "Reply with [[A]] if Assistant A's answer is better, [[B]] if Assistant B's answer is better.\""
    ',"role":"system"}'
)

_judgements = sa.table(
    "judgements",
    sa.column("model_a", sa.String),
    sa.column("model_b", sa.String),
    sa.column("orientation", sa.String),
    sa.column("input_text", sa.Text),
)


def _swap_default_prompt_reversed_rows() -> None:
    # SET a = b, b = a reads both old values (SQL standard; SQLite and PostgreSQL agree).
    op.execute(
        _judgements.update()
        .where(
            _judgements.c.orientation == "reversed",
            sa.func.substr(_judgements.c.input_text, 1, len(_V0_1_SYSTEM_MESSAGE)) == _V0_1_SYSTEM_MESSAGE,
        )
        .values(model_a=_judgements.c.model_b, model_b=_judgements.c.model_a)
    )


def upgrade() -> None:
    _swap_default_prompt_reversed_rows()


def downgrade() -> None:
    # The swap is its own inverse: rows of that prompt go back to 0.1.0's meaning.
    _swap_default_prompt_reversed_rows()
