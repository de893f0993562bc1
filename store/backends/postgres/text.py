"""Text as a PostgreSQL store keeps it: U+0000 escaped reversibly, so every value a folder keeps, a server keeps.

Contract:

* PostgreSQL's ``text`` cannot hold U+0000 (psycopg refuses it before it is
  sent), and its ``json`` type accepts ``\\u0000`` but then fails every
  operator that reads the value (``->>``, casts; ``jsonb`` refuses it on
  input). SQLite keeps both. So on PostgreSQL every text column, and every
  string inside a JSON column (keys and values), is stored with two
  characters replaced: U+0000 becomes ``ESCAPE "0"`` and :data:`ESCAPE`
  itself becomes ``ESCAPE "1"``. :data:`ESCAPE` is U+FDD0, a Unicode
  *noncharacter* (reserved for a program's internal use, never assigned),
  so real text almost never holds it, and a value without U+0000 or U+FDD0
  is stored unchanged: byte for byte what SQLite holds.
* :func:`escape` and :func:`unescape` are exact inverses on every string
  (``unescape(escape(s)) == s``). :func:`unescape` keeps an :data:`ESCAPE`
  that no escape sequence follows (text another tool wrote) as it is.
* The escape maps characters one to one, so it commutes with concatenation:
  equality filters, ``IN`` lists, ``LIKE`` prefixes and indexes work on the
  escaped text with bound values escaped the same way, which
  :class:`EscapedString` and :class:`EscapedText` (the PostgreSQL variants of
  the models' text columns, :func:`server_safe`) do for every statement.
* :func:`dumps_json` / :func:`loads_json` are the PostgreSQL engine's JSON
  serializer and deserializer: :mod:`store.jsonvalues`' canonical JSON with
  the strings escaped as above, so the stored JSON never holds ``\\u0000``.
* The common case pays one scan for U+0000 per value written (memchr
  speed) and nothing on read for text without non-Latin-1 characters.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, Text
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from store import jsonvalues

ESCAPE = "\ufdd0"
_ESCAPED_NUL = ESCAPE + "0"
_ESCAPED_ESCAPE = ESCAPE + "1"
_ESCAPE_BYTES = ESCAPE.encode()
_NUL_IN_JSON = "\\u0000"  # how canonical JSON writes U+0000 inside a string


def escape(value: str) -> str:
    """``value`` as a PostgreSQL text column stores it (see the module docstring)."""
    if "\0" not in value and ESCAPE not in value:
        return value
    return value.replace(ESCAPE, _ESCAPED_ESCAPE).replace("\0", _ESCAPED_NUL)


def unescape(value: str) -> str:
    """Inverse of :func:`escape`."""
    if ESCAPE not in value:
        return value
    head, *parts = value.split(ESCAPE)
    out = [head]
    for part in parts:
        code = part[:1]
        if code == "0":
            out.append("\0" + part[1:])
        elif code == "1":
            out.append(ESCAPE + part[1:])
        else:  # not an escape sequence of ours: kept as it was
            out.append(ESCAPE + part)
    return "".join(out)


def escaped_bytes(value: str) -> int:
    """UTF-8 bytes of ``escape(value)`` (what an index entry of the value takes on PostgreSQL)."""
    return len(value.encode("utf-8", "surrogatepass")) + 3 * value.count("\0") + value.count(ESCAPE)


def _bind(value: Any) -> Any:
    return escape(value) if type(value) is str else value


def _result(value: Any) -> Any:
    return unescape(value) if type(value) is str else value


class EscapedString(TypeDecorator[str]):
    """``VARCHAR`` on PostgreSQL, values escaped both ways (see the module docstring)."""

    impl = String
    cache_ok = True

    # The processors are returned directly, not through process_bind_param: that wrapper costs a call per value,
    # and this type only ever runs on PostgreSQL (server_safe), where String has no processors of its own.
    def bind_processor(self, dialect: Dialect) -> Any:
        return _bind

    def result_processor(self, dialect: Dialect, coltype: object) -> Any:
        return _result

    def process_literal_param(self, value: Any, dialect: Dialect) -> str:
        return _bind(value)  # type: ignore[no-any-return]


class EscapedText(EscapedString):
    """``TEXT`` on PostgreSQL, values escaped both ways."""

    impl = Text
    cache_ok = True


def server_safe(base: String) -> TypeEngine[str]:
    """``base`` (a ``String`` or ``Text``), with its escaping variant on PostgreSQL and untouched elsewhere."""
    variant = EscapedText if isinstance(base, Text) else EscapedString
    return base.with_variant(variant(base.length), "postgresql")


# ---------------------------------------------------------------- JSON columns


def _walk(value: Any, change: Any) -> Any:
    """``value`` with ``change`` applied to every string in it, keys included; a dict a key of which changed is
    sorted again.

    Keys come back from the stored text in the order of their stored (escaped) form, ``"\ufdd00"`` after
    ``"0"``; the value written had them in canonical order, ``"\u0000"`` first, which is how they read back.
    (Escaping needs no sort: canonical JSON sorts the keys it writes.)
    """
    if type(value) is str:
        return change(value)
    if isinstance(value, dict):
        items = [(change(k) if type(k) is str else k, _walk(v, change)) for k, v in value.items()]
        changed = any(new is not old for (new, _), old in zip(items, value, strict=True))
        if changed and all(type(k) is str for k in value):  # read JSON has only string keys
            items.sort(key=lambda item: item[0])
        return dict(items)
    if isinstance(value, list | tuple):
        return [_walk(v, change) for v in value]
    return value


def dumps_json(value: Any) -> str:
    """A JSON column's value as PostgreSQL stores it: canonical JSON, strings escaped."""
    text = jsonvalues.dumps(value)
    if _NUL_IN_JSON in text or ESCAPE in text:  # a backslash before "u0000" also matches: escaping finds nothing then
        text = jsonvalues.dumps(_walk(value, escape))
    return text


def loads_json(data: str | bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`dumps_json` (psycopg hands its loader bytes)."""
    if isinstance(data, memoryview | bytearray):
        data = bytes(data)
    value = jsonvalues.loads(data)
    found = ESCAPE in data if isinstance(data, str) else _ESCAPE_BYTES in data
    return _walk(value, unescape) if found else value
