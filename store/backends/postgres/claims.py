"""PostgreSQL's side of the claims table (:mod:`store.claims`): the server's clock, ``FOR UPDATE SKIP LOCKED``.

Contract: claimers on many nodes pick their blocks with ``SELECT ... FOR
UPDATE SKIP LOCKED`` (a row another claimer's transaction holds is skipped,
not waited for: PostgreSQL's work-queue idiom); leases are measured by the
server's ``now()``, so nodes whose clocks differ still agree on a deadline;
keys are one array parameter (``= ANY(:keys)``), as in the bulk lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Insert, Select, String, any_, bindparam, func, select
from sqlalchemy.dialects import postgresql

from store.claim_table import CLAIMS, ClaimTable


class PostgresClaimTable(ClaimTable):
    def now(self) -> datetime:
        value: datetime = self.conn.execute(select(func.now())).scalar_one()
        return value.astimezone(UTC)

    def _keys_in(self, column: Any) -> ColumnElement[bool]:
        return column == any_(bindparam("keys", type_=postgresql.ARRAY(String)))  # type: ignore[no-any-return]

    def _keys(self, keys: Sequence[str]) -> Any:
        return list(keys)

    def _insert_ignoring(self) -> Insert:
        return postgresql.insert(CLAIMS).on_conflict_do_nothing()

    def _locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True, of=CLAIMS)
