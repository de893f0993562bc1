"""The remote layout, and how paths and metadata read from a remote are checked.

Contract::

    {role}/{task}/{provider}/{model}/{descriptor_hash16}/
        metadata.json                      the bytes store.layout.metadata_bytes() writes
        shards/{sha256}.jsonl.gz           immutable shards (see store.sync.shards)

* Segments are percent-encoded exactly as in a local store
  (:func:`store.segments.encode_segment`, long names shortened), so a remote
  folder and a local folder of the same descriptor have the same relative
  path. A shortened segment parses to a :class:`~store.segments.ShortName`
  until the folder's metadata.json gives the whole name.
* Every path read from a remote is untrusted. :func:`parse_remote_path`
  accepts only the two shapes above, with ``/`` separators, a known role, a
  16-hex descriptor folder, a 64-hex shard name, and segments in canonical
  percent-encoding (so no ``..``, ``.``, empty segment, absolute path,
  backslash or encoded ``%2E%2E`` gets through). Anything else raises.
* :func:`verify_remote_metadata` accepts a metadata.json only if it is
  byte-identical to what this library writes for the descriptor it holds, and
  that descriptor hashes to the folder's name under the folder's role, task,
  provider and model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson
from pydantic import ValidationError

from store.descriptor import ModelDescriptor
from store.errors import (
    UPGRADE_JUDGESTORE,
    InvalidInputError,
    RemoteMetadataError,
    UnsafeRemotePathError,
    UntrustedContentError,
)
from store.layout import LEVELS, METADATA_FILE, Location, StoredMetadata, metadata_bytes
from store.roles import ROLES, check_role
from store.segments import decode_segment
from store.sync.shards import HASH64, SHARD_SUFFIX, shard_file_name

SHARDS_DIR = "shards"
METADATA_MAX_BYTES = 1024 * 1024
HASH16 = re.compile(r"[0-9a-f]{16}")


def remote_folder(location: Location) -> str:
    return location.relative_folder().as_posix()


def metadata_path(location: Location) -> str:
    return f"{remote_folder(location)}/{METADATA_FILE}"


def shard_path(location: Location, name: str) -> str:
    return f"{remote_folder(location)}/{SHARDS_DIR}/{shard_file_name(name)}"


@dataclass(frozen=True, slots=True)
class RemotePath:
    """A parsed remote path: the folder's location, and the shard's name (None for metadata.json)."""

    location: Location
    shard: str | None


def safe_segments(path: str) -> list[str]:
    """The ``/``-separated segments of an untrusted relative path; raise if any could escape or alias."""
    if not isinstance(path, str) or not path:
        raise UnsafeRemotePathError(repr(path), "is not a path")
    if path.startswith("/") or "\\" in path or any(ord(c) < 0x20 or c == "\x7f" for c in path):
        raise UnsafeRemotePathError(path, "is absolute or holds a backslash or control character; refusing it")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafeRemotePathError(path, "has an empty, '.' or '..' segment; refusing it")
    return parts


def folder_segment(level: str, segment: str, path: str) -> str:
    """Decode one folder segment at ``level`` (see :data:`LEVELS`); raise if it is not one judgestore writes."""
    if level == "role":
        if segment not in ROLES:
            raise UntrustedContentError(path, f"{segment!r} is not a role folder ({' or '.join(ROLES)})")
        return segment
    if level == "descriptor":
        if not HASH16.fullmatch(segment):
            raise UntrustedContentError(path, f"{segment!r} is not a descriptor folder (16 lowercase hex)")
        return segment
    try:
        return decode_segment(segment)
    except InvalidInputError as e:
        raise UnsafeRemotePathError(path, f"segment {segment!r} is not in canonical percent-encoding ({e})") from e


def parse_remote_path(path: str) -> RemotePath:
    """Parse a file path listed by a remote; raise :class:`UntrustedContentError` for anything unexpected."""
    parts = safe_segments(path)
    folder = [folder_segment(level, segment, path) for level, segment in zip(LEVELS, parts[:5], strict=False)]
    if len(parts) == 6 and parts[5] == METADATA_FILE:
        shard = None
    elif (
        len(parts) == 7
        and parts[5] == SHARDS_DIR
        and parts[6].endswith(SHARD_SUFFIX)
        and HASH64.fullmatch(parts[6].removesuffix(SHARD_SUFFIX))
    ):
        shard = parts[6].removesuffix(SHARD_SUFFIX)
    else:
        raise UntrustedContentError(path, "is not a metadata.json or a shards/{sha256}.jsonl.gz of a descriptor folder")
    role, task, provider, model, hash16 = folder
    return RemotePath(Location(check_role(role), task, provider, model, hash16), shard)


def verify_remote_metadata(data: bytes, location: Location) -> StoredMetadata:
    """Check a remote metadata.json against its folder; return what it says."""
    where = metadata_path(location)
    if len(data) > METADATA_MAX_BYTES:
        raise RemoteMetadataError(where, f"is {len(data):,} bytes; a metadata.json is far smaller")
    try:
        doc = orjson.loads(data)
        descriptor = ModelDescriptor.model_validate(doc["descriptor"])
        role, task = check_role(doc["role"]), doc["task"]
        assumptions = tuple(doc.get("assumptions", ()))
        if not isinstance(task, str) or not all(isinstance(a, str) for a in assumptions):
            raise TypeError("task and assumptions must be strings")
        expected = metadata_bytes(role, task, descriptor, assumptions)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValidationError, InvalidInputError) as e:
        raise RemoteMetadataError(where, f"is not a judgestore metadata.json ({e})") from e
    actual = (role, task, descriptor.provider, descriptor.model, descriptor.hash16())
    folder = (location.role, location.task, location.provider, location.model, location.descriptor_hash16)
    if Location(*actual).relative_folder() != location.relative_folder():  # by segment: long names are shortened
        raise RemoteMetadataError(
            where,
            f"describes {'/'.join(actual)} but lies in the folder {'/'.join(folder)}; the folder was moved or the "
            "file edited",
        )
    if data != expected:
        raise RemoteMetadataError(
            where,
            "is not byte-identical to the metadata.json this library writes for its descriptor (written by "
            f"another judgestore version, or edited); if a newer judgestore wrote it, {UPGRADE_JUDGESTORE}",
        )
    return StoredMetadata(role, task, descriptor, descriptor.sha256(), assumptions)
