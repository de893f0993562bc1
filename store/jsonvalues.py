"""JSON column values (``usage``, ``top_logprobs``): canonical text, and every float kept exactly.

Contract:

* :func:`dumps` writes canonical JSON (sorted keys, compact, unescaped UTF-8);
  :func:`loads` reads it back so that ``loads(dumps(v)) == v`` for every
  value of plain JSON types, including the floats JSON has no literal for:
  NaN, ``inf`` and ``-inf`` (vLLM reports ``-inf`` logprobs for masked
  tokens). Those are written as the one-key object ``{"$float": "NaN" |
  "Infinity" | "-Infinity"}``, which stays valid JSON for SQLite's and
  PostgreSQL's JSON functions, and turned back into floats on read.
* A value that itself holds a one-key object ``{"$float": <string>}`` would be
  read back as a float, so it is refused with
  :class:`~store.errors.InvalidInputError` before anything is written; so is
  anything JSON cannot carry (lone surrogates, non-string keys).
* A bare number (a value that is only a number, not inside an object or a
  list) is refused the same way: a JSON column on SQLite has numeric
  affinity, which would keep ``5`` as the integer 5 (and ``1.0`` as 1), not
  as the JSON text, and so could not give it back exactly.
* :func:`to_plain` / :func:`from_plain` do the same conversion on decoded
  values, for formats that embed column values in a larger JSON document
  (sharing's shards).
* The common case pays nothing extra: the tagged walk runs only when the
  compact bytes contain ``null`` (orjson writes NaN and infinities as null) or
  the tag itself.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from store.descriptor import canonical_json
from store.errors import InvalidInputError

FLOAT_TAG = "$float"
_TAG_TEXT = f'"{FLOAT_TAG}"'
_TAG_BYTES = _TAG_TEXT.encode()
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _tag(value: float) -> dict[str, str]:
    return {FLOAT_TAG: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}


def _is_tag(value: dict[Any, Any]) -> bool:
    return len(value) == 1 and isinstance(value.get(FLOAT_TAG), str)


def to_plain(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its tag; refuses a tag-shaped object."""
    if isinstance(value, float):
        return value if math.isfinite(value) else _tag(value)
    if isinstance(value, dict):
        if _is_tag(value):
            raise InvalidInputError(
                f"a JSON value holds the object {value!r}, which judgestore reserves for NaN and infinities; "
                "rename its key"
            )
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def from_plain(value: Any) -> Any:
    """Inverse of :func:`to_plain`: tags become floats again."""
    if isinstance(value, dict):
        if _is_tag(value):
            text = value[FLOAT_TAG]
            if text not in _NONFINITE:
                raise InvalidInputError(f"unknown non-finite float {text!r} (known: {', '.join(_NONFINITE)})")
            return _NONFINITE[text]
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    return value


def dumps_bytes(value: Any) -> bytes:
    """Canonical JSON bytes of a column value; see the module docstring."""
    if type(value) is not dict and isinstance(value, int | float) and not isinstance(value, bool):
        raise InvalidInputError(
            f"a JSON column holds an object, a list, a string, a boolean or null, not a bare number ({value!r}): "
            "SQLite would keep it as a number, not as its JSON; put it in an object"
        )
    try:
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)  # canonical_json's, without a call per value
    except (orjson.JSONEncodeError, TypeError):
        data = canonical_json(value)  # raises its typed error
    if b"null" in data or _TAG_BYTES in data:
        data = canonical_json(to_plain(value))
    return data


def dumps(value: Any) -> str:
    """Canonical JSON text of a column value (what the database stores)."""
    return dumps_bytes(value).decode()


def loads(text: str | bytes) -> Any:
    """A column value read back: :func:`dumps` inverted exactly."""
    value = orjson.loads(text)
    tagged = _TAG_TEXT in text if isinstance(text, str) else _TAG_BYTES in text
    return from_plain(value) if tagged else value
