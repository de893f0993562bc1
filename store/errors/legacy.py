"""Legacy imports: an old cache that cannot be read, or whose descriptor the live rules cannot reproduce.

Contract: every error of reading a legacy cache is a :class:`LegacyError`;
nothing of a cache refused with one is imported.
"""

from __future__ import annotations

from store.errors.base import JudgestoreError
from store.errors.inputs import InvalidInputError

__all__ = [
    "DataFrameError",
    "LegacyError",
    "LegacyMappingError",
]


class LegacyError(JudgestoreError):
    """Base class of the errors of reading legacy caches."""


class DataFrameError(LegacyError):
    """A DataFrame cache (CSV, zipped CSV, parquet) cannot be read, or lacks a column."""


class LegacyMappingError(LegacyError, InvalidInputError):
    """A legacy descriptor that the live rules cannot reproduce (the message says why)."""
