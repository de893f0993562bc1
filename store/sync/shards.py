"""Shards: the immutable, byte-deterministic files in which rows travel between stores.

Contract:

* A shard is gzip-compressed JSON Lines. Line 1 is the header, canonical
  JSON with exactly ``format`` (``judgestore-shard/v1``), ``role``, ``task``,
  ``provider``, ``model``, ``descriptor_sha256`` (the full hash), ``rows`` and
  ``library_version``. Every following line is one row: canonical JSON of the
  record's fields (``created_at`` as ISO-8601 UTC, ``+00:00``; the JSON
  columns as :func:`store.jsonvalues.to_plain` gives them, so NaN and
  infinities travel exactly), rows in strictly increasing ``input_hash``
  order. Every line ends with ``\\n``. ``adopted_from`` (:data:`OMITTED_WHEN_NULL`)
  is written only for an adopted row, so the line of every other row is what
  libraries before revision 0004 wrote and read.
* A shard's name is the SHA-256 hex of its uncompressed bytes; its file is
  ``{name}.jsonl.gz``, compressed with gzip mtime 0 and no file name, so the
  same rows (written by the same library version) give the same file on every
  machine. Identity is the *uncompressed* content: two zlib builds may
  compress differently, and both files are the same shard.
* :func:`read_shard` trusts nothing: it decompresses with a size cap, rejects
  a truncated stream or trailing bytes, checks the SHA-256 against the name,
  the header against the folder the shard was found in, every line for
  canonical form, every row against the table's schema and the values the
  store takes (:func:`store.tables.row_checks.check_values`: a shard an older
  library pushed may hold one it now refuses), and recomputes every input
  hash with :func:`store.descriptor.input_hash`. It returns records
  only if *all* of that holds, so a caller imports all of a shard or none.
* Judgement rows of shards pushed by judgestore 0.1.0 are read with today's
  meaning of ``model_a``/``model_b`` (the positional slots of the judge
  prompt): the reversed rows that 0.1.0's default judge prompt wrote with the
  pair's identity get their slots swapped, as migration 0002 does in a store.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from store import jsonvalues
from store.descriptor import canonical_json, input_hash, render_messages
from store.errors import UPGRADE_JUDGESTORE, InvalidInputError, ShardError
from store.layout import StoredMetadata
from store.roles import Role
from store.settings import MAX_SHARD_BYTES, SHARD_TARGET_BYTES
from store.tables.records import RECORD_OF_ROLE, Record, record_fields
from store.tables.row_checks import check_values

SHARD_FORMAT = "judgestore-shard/v1"
SHARD_SUFFIX = ".jsonl.gz"
_HEADER_KEYS = frozenset(
    {"format", "role", "task", "provider", "model", "descriptor_sha256", "rows", "library_version"}
)
HASH64 = re.compile(r"[0-9a-f]{64}")
JSON_COLUMNS = ("usage", "top_logprobs")
OMITTED_WHEN_NULL = ("adopted_from",)  # fields added after the first shards: absent means NULL
# judgestore 0.1.0's default judge prompt: its reversed rows carry the pair's identity (see the module docstring).
IDENTITY_SLOTS_VERSIONS = frozenset({"0.1.0"})
_V0_1_PAIRWISE_SYSTEM = (
    "You are an impartial judge. Compare the two answers to the user's question. "
    "Reply with [[A]] if Assistant A's answer is better, [[B]] if Assistant B's answer is better."
)
_IDENTITY_SLOTS_PREFIX = render_messages([{"role": "system", "content": _V0_1_PAIRWISE_SYSTEM}]).removesuffix(
    '],"type":"messages"}'
)


def _newer(version: str) -> bool:
    """Whether ``version`` (a shard header's) is a release after this library's; False when either is no release
    number (a source tree's "unknown")."""

    def release(text: str) -> tuple[int, ...] | None:
        parts = text.split("+")[0].split(".")[:3]
        return tuple(map(int, parts)) if all(part.isdigit() for part in parts) else None

    theirs, ours = release(version), release(library_version())
    return theirs is not None and ours is not None and theirs > ours


@functools.cache
def library_version() -> str:
    try:
        return importlib.metadata.version("judgestore")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def shard_file_name(name: str) -> str:
    return f"{name}{SHARD_SUFFIX}"


@dataclass(frozen=True, slots=True)
class ShardOrigin:
    """Where a shard's rows belong: what its header must say, and what the folder it lies in says."""

    role: Role
    task: str
    provider: str
    model: str
    descriptor_sha256: str

    @classmethod
    def of(cls, metadata: StoredMetadata) -> ShardOrigin:
        d = metadata.descriptor
        return cls(metadata.role, metadata.task, d.provider, d.model, metadata.descriptor_sha256)

    def header(self, rows: int, version: str) -> dict[str, Any]:
        return {
            "format": SHARD_FORMAT,
            "role": self.role,
            "task": self.task,
            "provider": self.provider,
            "model": self.model,
            "descriptor_sha256": self.descriptor_sha256,
            "rows": rows,
            "library_version": version,
        }


@dataclass(frozen=True, slots=True)
class BuiltShard:
    """A shard written to a staging folder, ready to be sent."""

    name: str
    path: Path
    rows: int
    keys: tuple[str, ...]
    size: int  # compressed bytes

    @property
    def file_name(self) -> str:
        return shard_file_name(self.name)


@dataclass(frozen=True, slots=True)
class Shard:
    """A validated shard: its header and its records, in key order."""

    name: str
    header: dict[str, Any]
    records: list[Record]

    @property
    def keys(self) -> list[str]:
        return [r.input_hash for r in self.records]


# ---------------------------------------------------------------- writing


def row_line(record: Record) -> bytes:
    """One row's line: canonical JSON of every field of the record (but a null :data:`OMITTED_WHEN_NULL`)."""
    fields = record_fields(type(record))
    values = {name: getattr(record, name) for name in fields}
    for name in OMITTED_WHEN_NULL:
        if values[name] is None:
            del values[name]
    values["created_at"] = record.created_at.astimezone(UTC).isoformat()
    for name in JSON_COLUMNS:
        values[name] = jsonvalues.to_plain(values[name])
    return canonical_json(values) + b"\n"


class ShardWriter:
    """Cut rows, given in increasing key order, into shards of about ``target_bytes`` (uncompressed).

    The cut points depend only on the rows, so the same rows always give the
    same shards. Each shard is written to ``staging`` as soon as it is full,
    so memory holds one shard at a time.
    """

    def __init__(self, origin: ShardOrigin, staging: Path, target_bytes: int = SHARD_TARGET_BYTES) -> None:
        self.origin = origin
        self.staging = staging
        self.target_bytes = target_bytes
        self.shards: list[BuiltShard] = []
        self._lines: list[bytes] = []
        self._keys: list[str] = []
        self._size = 0

    def add(self, record: Record) -> None:
        if self._keys and record.input_hash <= self._keys[-1]:
            raise ValueError(f"rows must come in strictly increasing key order ({record.input_hash})")
        line = row_line(record)
        if self._lines and self._size + len(line) > self.target_bytes:
            self._flush()
        self._lines.append(line)
        self._keys.append(record.input_hash)
        self._size += len(line)

    def close(self) -> list[BuiltShard]:
        if self._lines:
            self._flush()
        return self.shards

    def _flush(self) -> None:
        header = canonical_json(self.origin.header(len(self._lines), library_version())) + b"\n"
        content = header + b"".join(self._lines)
        name = hashlib.sha256(content).hexdigest()
        data = gzip.compress(content, compresslevel=6, mtime=0)
        self.staging.mkdir(parents=True, exist_ok=True)
        path = self.staging / shard_file_name(name)
        path.write_bytes(data)
        self.shards.append(BuiltShard(name, path, len(self._lines), tuple(self._keys), len(data)))
        self._lines, self._keys, self._size = [], [], 0


def build_shards(
    origin: ShardOrigin, records: Iterable[Record], staging: Path, target_bytes: int = SHARD_TARGET_BYTES
) -> list[BuiltShard]:
    """Shards holding ``records`` (sorted here by key; duplicate keys keep the first)."""
    writer = ShardWriter(origin, staging, target_bytes)
    seen: set[str] = set()
    for record in sorted(records, key=lambda r: r.input_hash):
        if record.input_hash not in seen:
            seen.add(record.input_hash)
            writer.add(record)
    return writer.close()


# ---------------------------------------------------------------- reading


def gunzip_capped(data: bytes, max_bytes: int, where: str) -> bytes:
    """Decompress one gzip member, refusing more than ``max_bytes`` of output, truncation and trailing bytes."""
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        content = decompressor.decompress(data, max_bytes + 1)
    except zlib.error as e:
        raise ShardError(where, f"is not valid gzip ({e})") from e
    if len(content) > max_bytes:
        raise ShardError(where, f"decompresses to more than {max_bytes:,} bytes (the cap); refusing it")
    if not decompressor.eof:
        raise ShardError(where, "is truncated (the gzip stream ends early)")
    if decompressor.unused_data:
        raise ShardError(where, "has bytes after the end of its gzip stream")
    return content


def read_shard(data: bytes, name: str, origin: ShardOrigin, *, where: str, max_bytes: int = MAX_SHARD_BYTES) -> Shard:
    """Validate a shard completely and return its records; raise :class:`ShardError` on the first problem."""
    if len(data) > max_bytes:
        raise ShardError(where, f"is {len(data):,} bytes, over the cap of {max_bytes:,}")
    content = gunzip_capped(data, max_bytes, where)
    actual = hashlib.sha256(content).hexdigest()
    if actual != name:
        raise ShardError(where, f"content hashes to {actual}, not to its name {name}: the file was altered")
    if not content.endswith(b"\n"):
        raise ShardError(where, "does not end with a newline")
    lines = content[:-1].split(b"\n")
    header = _read_header(lines[0], origin, where)
    if header["rows"] != len(lines) - 1:
        raise ShardError(where, f"header says {header['rows']} rows but the shard holds {len(lines) - 1}")
    check_row = _ROW_CHECKS[origin.role]
    record_type = RECORD_OF_ROLE[origin.role]
    identity_slots = origin.role == "judgements" and header["library_version"] in IDENTITY_SLOTS_VERSIONS
    records: list[Record] = []
    previous = ""
    for lineno, line in enumerate(lines[1:], start=2):
        row = _canonical_object(line, where, lineno)
        try:
            values = check_row(row, where, lineno)
        except ShardError as e:
            unknown = sorted(set(row) - set(_SCHEMAS[origin.role])) if isinstance(row, dict) else []
            if unknown:  # a column a schema revision this library lacks added, not an edit
                if _newer(header["library_version"]):
                    by = f"judgestore {header['library_version']}, newer than this {library_version()} "
                    by += f"({UPGRADE_JUDGESTORE})"
                else:  # an older or the same release: a schema revision of its own (a fork's, a clone's)
                    by = "a judgestore with schema revisions this one lacks (its own: a fork's, or an edited clone's)"
                raise ShardError(where, f"{e.reason}; {', '.join(unknown)} came from {by}") from e
            raise
        if values["input_hash"] <= previous:
            raise ShardError(where, f"line {lineno}: rows are not in strictly increasing input_hash order")
        previous = values["input_hash"]
        if (
            identity_slots
            and values["orientation"] == "reversed"
            and values["input_text"].startswith(_IDENTITY_SLOTS_PREFIX)
        ):
            values["model_a"], values["model_b"] = values["model_b"], values["model_a"]
        record = record_type(**values)
        try:
            check_values(origin.role, record)  # refused here, the shard alone is quarantined, not its whole group
        except InvalidInputError as e:
            raise ShardError(where, f"line {lineno}: {e}") from e
        records.append(record)
    return Shard(name, header, records)


def _canonical_object(line: bytes, where: str, lineno: int) -> Any:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise ShardError(where, f"line {lineno} is not JSON ({e})") from e
    try:
        canonical = canonical_json(value)
    except ValueError as e:  # InvalidInputError: a value JSON cannot carry
        raise ShardError(where, f"line {lineno}: {e}") from e
    if canonical != line:
        raise ShardError(where, f"line {lineno} is not canonical JSON (sorted keys, compact, UTF-8)")
    return value


def _read_header(line: bytes, origin: ShardOrigin, where: str) -> dict[str, Any]:
    header = _canonical_object(line, where, 1)
    if not isinstance(header, dict) or header.get("format") != SHARD_FORMAT:
        found = header.get("format") if isinstance(header, dict) else None
        raise ShardError(
            where,
            f"header format is {found!r}, not {SHARD_FORMAT!r}: written by a newer judgestore or not a shard "
            f"({UPGRADE_JUDGESTORE})",
        )
    if set(header) != _HEADER_KEYS:
        raise ShardError(where, f"header keys {sorted(header)} are not {sorted(_HEADER_KEYS)}")
    rows = header["rows"]
    if type(rows) is not int or rows < 1 or not isinstance(header["library_version"], str):
        raise ShardError(where, "header 'rows' must be a positive integer and 'library_version' a string")
    expected = origin.header(rows, header["library_version"])
    wrong = [key for key in ("role", "task", "provider", "model", "descriptor_sha256") if header[key] != expected[key]]
    if wrong:
        found = ", ".join(f"{key}={header[key]!r}" for key in wrong)
        wanted = ", ".join(f"{key}={expected[key]!r}" for key in wrong)
        raise ShardError(where, f"header says {found} but the shard lies in the folder of {wanted}")
    return header


# ---------------------------------------------------------------- row schema

Check = Callable[[Any], bool]


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_hash(v: Any) -> bool:
    return isinstance(v, str) and HASH64.fullmatch(v) is not None


def _is_index(v: Any) -> bool:
    return type(v) is int and v >= 0


def _is_object(v: Any) -> bool:
    return isinstance(v, dict)


def _is_orientation(v: Any) -> bool:
    return v in ("direct", "reversed")


def _is_utc_timestamp(v: Any) -> bool:
    if not isinstance(v, str):
        return False
    try:
        parsed = datetime.fromisoformat(v)
    except ValueError:
        return False
    return parsed.utcoffset() is not None and parsed.astimezone(UTC).isoformat() == v


_COMMON: dict[str, Check] = {
    "input_hash": _is_hash,
    "sample_index": _is_index,
    "input_text": _is_str,
    "completion": _is_str,
    "benchmark": _optional(_is_str),
    "instruction_id": _optional(_is_str),
    "finish_reason": _optional(_is_str),
    "usage": _optional(_is_object),
    "top_logprobs": _optional(_is_object),
    "run_id": _optional(_is_str),
    "created_by": _optional(_is_str),
    "created_at": _is_utc_timestamp,
    "adopted_from": _is_hash,  # present only when set (OMITTED_WHEN_NULL)
}
_CHECKED: dict[str, dict[str, Check]] = {
    "completions": {**_COMMON, "model": _optional(_is_str)},
    "judgements": {
        **_COMMON,
        "model_a": _optional(_is_str),
        "model_b": _optional(_is_str),
        "judge": _optional(_is_str),
        "orientation": _optional(_is_orientation),
    },
}
_OF_TYPE: dict[type, Check] = {str: _is_str, int: lambda v: type(v) is int, bool: lambda v: type(v) is bool,
                               float: lambda v: type(v) in (int, float)}  # fmt: skip


def _declared(role: str, name: str) -> Check:
    """The check of a column :data:`_CHECKED` does not name (one a schema revision added since, as the worked
    example's ``verdict``): a value of the type its model declares, or null where the column is nullable. Without
    it, every shard pushed after the revision was quarantined on fetch for a field it did not expect."""
    from store.tables.models import MODEL_OF_ROLE

    column = MODEL_OF_ROLE[role].__table__.c[name]
    try:
        check = _OF_TYPE.get(column.type.python_type, lambda v: True)
    except NotImplementedError:
        check = lambda v: True  # noqa: E731  # a type that names no Python type: any value JSON carries
    return _optional(check) if column.nullable else check


# A shard row's fields, each with its check: every field of the role's records (store.tables.records, generated
# from the models), so a row of any column round-trips.
_SCHEMAS: dict[str, dict[str, Check]] = {
    role: {name: checks.get(name) or _declared(role, name) for name in record_fields(RECORD_OF_ROLE[role])}
    for role, checks in _CHECKED.items()
}


def _row_checker(role: str) -> Callable[[Any, str, int], dict[str, Any]]:
    schema = _SCHEMAS[role]
    names = frozenset(schema)
    # The fields of the first shards; a column added since (a schema revision's) may be absent: a shard pushed
    # before it holds none, read as NULL, as the upgraded database's rows of before it do
    required = frozenset(_CHECKED[role]) - frozenset(OMITTED_WHEN_NULL)

    def check(row: Any, where: str, lineno: int) -> dict[str, Any]:
        if not isinstance(row, dict) or not required <= set(row) <= names:
            got = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ShardError(
                where,
                f"line {lineno}: a {role} row needs exactly the fields {sorted(required)} "
                f"(and {', '.join(sorted(names - required))} when set), got {got}",
            )
        bad = [name for name, ok in schema.items() if name in row and not ok(row[name])]
        if bad:
            raise ShardError(where, f"line {lineno}: invalid value for {', '.join(bad)}")
        try:
            recomputed = input_hash(row["input_text"], row["sample_index"])
        except (ValueError, TypeError) as e:  # sample k > 0 of an input that is not JSON
            raise ShardError(where, f"line {lineno}: input_text cannot be hashed ({e})") from e
        if recomputed != row["input_hash"]:
            raise ShardError(
                where, f"line {lineno}: input_hash {row['input_hash']} is not the hash of its input ({recomputed})"
            )
        try:
            json_values = {name: jsonvalues.from_plain(row[name]) for name in JSON_COLUMNS}
        except ValueError as e:  # InvalidInputError: an unknown tag
            raise ShardError(where, f"line {lineno}: {e}") from e
        return {**row, **json_values, "created_at": datetime.fromisoformat(row["created_at"]).astimezone(UTC)}

    return check


_ROW_CHECKS = {role: _row_checker(role) for role in _SCHEMAS}
