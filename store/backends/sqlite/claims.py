"""SQLite's side of the claims table (:mod:`store.claims`): this machine's clock, ``json_each`` key lists.

Contract: a claim runs in a write transaction that took the database's write
lock up front (``BEGIN IMMEDIATE``), so claimers on this machine take turns
and no row lock is needed; keys are one JSON-array parameter, as in the bulk
lookup (:func:`~store.backends.sqlite.rows.json_each_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy import ColumnElement, Insert, select
from sqlalchemy.dialects import sqlite

from store.backends.sqlite.rows import json_each_keys
from store.claim_table import CLAIMS, ClaimTable


class SqliteClaimTable(ClaimTable):
    def now(self) -> datetime:
        return datetime.now(UTC)

    def _keys_in(self, column: Any) -> ColumnElement[bool]:
        return column.in_(select(json_each_keys().c.value))  # type: ignore[no-any-return]

    def _keys(self, keys: Sequence[str]) -> Any:
        return orjson.dumps(list(keys)).decode()

    def _insert_ignoring(self) -> Insert:
        return sqlite.insert(CLAIMS).on_conflict_do_nothing()
