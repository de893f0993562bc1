"""judgestore's store: the public names, importable from ``store`` itself.

Contract:

* ``from store import Store, Selector, RowFilter, Completion, Judgement, Run``
  (and the other names of :data:`__all__`) is the supported way in; the
  modules behind these names may move, these names stay.
* Importing ``store`` (or any of its modules) imports nothing of these until
  a name is used (:pep:`562`): a process that only hashes inputs, or the
  command line's start, pays only for what it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public name -> the module that defines it.
_WHERE = {
    "Store": "store.store",
    "Found": "store.across",
    "Database": "store.backend",
    "Location": "store.layout",
    "Selector": "store.layout",
    "RowFilter": "store.tables.filters",
    "FoundRow": "store.rows",
    "RowCount": "store.rows",
    "DeletePlan": "store.rows",
    "CompletionRecord": "store.tables.records",
    "JudgementRecord": "store.tables.records",
    "Record": "store.tables.records",
    "Completion": "store.tables.models",
    "Judgement": "store.tables.models",
    "Run": "store.tables.models",
    "Adoption": "store.tables.models",
    "ModelDescriptor": "store.descriptor",
    "input_hash": "store.descriptor",
    "Settings": "store.settings",
    "SyncSettings": "store.settings",
    "text_logprobs": "store.logprobs",
    "RunRecord": "store.tables.records",
    "RunTotals": "store.tables.records",
    "recent_runs": "store.runs",
    "run_totals": "store.runs",
    "AdoptionRecord": "store.tables.records",
    "adoptions": "store.adoption",
    "JudgestoreError": "store.errors",
    "InvalidInputError": "store.errors",
    "UnsupportedMessageError": "store.errors",
    "StatementError": "store.errors",
    "NotCombinableError": "store.errors",
    "AdoptionError": "store.errors",
    "to_pandas": "store.export",
}

__all__ = [
    "Adoption",
    "AdoptionError",
    "AdoptionRecord",
    "Completion",
    "CompletionRecord",
    "Database",
    "DeletePlan",
    "Found",
    "FoundRow",
    "InvalidInputError",
    "Judgement",
    "JudgementRecord",
    "JudgestoreError",
    "Location",
    "ModelDescriptor",
    "NotCombinableError",
    "Record",
    "RowCount",
    "RowFilter",
    "Run",
    "RunRecord",
    "RunTotals",
    "Selector",
    "Settings",
    "StatementError",
    "Store",
    "SyncSettings",
    "UnsupportedMessageError",
    "adoptions",
    "input_hash",
    "recent_runs",
    "run_totals",
    "text_logprobs",
    "to_pandas",
]

if TYPE_CHECKING:
    from store.across import Found
    from store.adoption import adoptions
    from store.backend import Database
    from store.descriptor import ModelDescriptor, input_hash
    from store.errors import (
        AdoptionError,
        InvalidInputError,
        JudgestoreError,
        NotCombinableError,
        StatementError,
        UnsupportedMessageError,
    )
    from store.export import to_pandas
    from store.layout import Location, Selector
    from store.logprobs import text_logprobs
    from store.rows import DeletePlan, FoundRow, RowCount
    from store.runs import recent_runs, run_totals
    from store.settings import Settings, SyncSettings
    from store.store import Store
    from store.tables.filters import RowFilter
    from store.tables.models import Adoption, Completion, Judgement, Run
    from store.tables.records import AdoptionRecord, CompletionRecord, JudgementRecord, Record, RunRecord, RunTotals


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain global
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
