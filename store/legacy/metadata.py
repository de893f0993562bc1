"""Legacy ``metadata.json`` files and legacy folder trees: what they say and whether they match.

Contract:

* :func:`read_legacy_metadata` reads one legacy ``metadata.json`` and tells its
  form by its keys, never by its place: ``S3+`` (``schema_version`` is
  ``judgearena-inference-cache/v1``), ``S2`` (``descriptor_schema_version`` is
  ``judgearena-inference-descriptor/v1``), ``S1`` (``model`` and ``arena``, no
  sampling settings), ``judgestore`` (a current judgestore metadata.json) or
  ``unknown``. It never raises for a bad file: the problem is recorded.
* The legacy folder hash is the first 16 hex characters of the SHA-256 of the
  file's object written as Python's ``json.dumps(sort_keys=True,
  separators=(",", ":"), ensure_ascii=False)``. That is recomputed with the
  stdlib ``json`` on purpose (not orjson): the legacy writer did not normalise
  ints and floats, and only the stdlib reproduces its float spelling byte for
  byte.
* :func:`legacy_tree` parses ``{root}/{role|inference}/{task}/{provider}/{model}/{hash16}/``
  from a file's path; :func:`check_metadata_folder` says why a metadata.json
  does not belong to the folder it lies in (hash or provider/model segments),
  or None when it does.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from store.descriptor import sha256_hex

S3_SCHEMA = "judgearena-inference-cache/v1"
S2_SCHEMA = "judgearena-inference-descriptor/v1"
LEGACY_METADATA_FILE = "metadata.json"
_HASH16 = re.compile(r"^[0-9a-f]{16}$")
# The role-level folder names of the legacy trees: S3+ per role, S2 role-less.
TREE_ROLES = ("completions", "judgements", "inference")


class MetadataForm(enum.StrEnum):
    S3 = "S3+"
    S2 = "S2"
    S1 = "S1"
    JUDGESTORE = "judgestore"
    UNKNOWN = "unknown"


def legacy_json(value: Any) -> bytes:
    """The bytes the legacy writer hashed: sorted keys, compact, unescaped UTF-8, numbers as written."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def legacy_hash(value: Any) -> str:
    return sha256_hex(legacy_json(value))


@dataclass(frozen=True, slots=True)
class LegacyTree:
    """Where a file lies in a legacy tree: ``{root}/{kind}/{task}/{provider}/{model}/{hash16}/``."""

    root: Path
    kind: str  # completions | judgements | inference
    task: str
    provider: str
    model: str
    hash16: str


@dataclass(frozen=True, slots=True)
class LegacyMetadata:
    """One legacy metadata.json as read; ``problem`` says why it cannot be trusted (None: it can)."""

    path: Path
    form: MetadataForm
    doc: dict[str, Any] = field(default_factory=dict)
    sha256: str | None = None  # the legacy hash of ``doc`` (S3+ folders are named by it)
    problem: str | None = None

    @property
    def provider(self) -> str | None:
        if self.form is MetadataForm.S3:
            value = self.doc.get("provider")
        elif self.form is MetadataForm.S2:
            spec = self.doc.get("model_spec")
            value = spec.split("/", 1)[0] if isinstance(spec, str) and "/" in spec else None
        else:
            value = None
        return value if isinstance(value, str) else None

    @property
    def model(self) -> str | None:
        value = self.doc.get("model")
        return value if isinstance(value, str) else None


def classify_metadata(doc: Any) -> MetadataForm:
    """The form of a legacy metadata object, by its keys."""
    if not isinstance(doc, dict):
        return MetadataForm.UNKNOWN
    if doc.get("schema_version") == S3_SCHEMA:
        return MetadataForm.S3
    if doc.get("descriptor_schema_version") == S2_SCHEMA:
        return MetadataForm.S2
    if str(doc.get("format", "")).startswith("judgestore-metadata/"):
        return MetadataForm.JUDGESTORE
    if "model" in doc and "arena" in doc:
        return MetadataForm.S1
    return MetadataForm.UNKNOWN


def read_legacy_metadata(path: Path) -> LegacyMetadata:
    """Read ``path``; a file that cannot be read or parsed comes back with its ``problem`` set."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        return LegacyMetadata(path, MetadataForm.UNKNOWN, problem=f"cannot be read ({e.strerror})")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return LegacyMetadata(path, MetadataForm.UNKNOWN, problem=f"is not valid JSON ({e})")
    form = classify_metadata(doc)
    if form is MetadataForm.UNKNOWN:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        return LegacyMetadata(path, form, doc if isinstance(doc, dict) else {}, problem=f"unknown form (keys {keys})")
    return LegacyMetadata(path, form, doc, legacy_hash(doc))


def legacy_tree(path: Path) -> LegacyTree | None:
    """The legacy tree position of a file (or folder) path, if its parents have that shape."""
    folder = path if path.is_dir() else path.parent
    parts = folder.parts
    if len(parts) < 6 or parts[-5] not in TREE_ROLES or not _HASH16.match(parts[-1]):
        return None
    kind, task, provider, model, hash16 = parts[-5:]
    return LegacyTree(Path(*parts[:-5]), kind, unquote(task), unquote(provider), unquote(model), hash16)


def check_metadata_folder(metadata: LegacyMetadata, tree: LegacyTree | None) -> str | None:
    """Why ``metadata`` does not match the folder it lies in, or None when it does (or nothing can be checked)."""
    if metadata.problem is not None:
        return f"{metadata.path}: {metadata.problem}"
    folder = metadata.path.parent
    if metadata.form is MetadataForm.S3 and _HASH16.match(folder.name):
        assert metadata.sha256 is not None
        if metadata.sha256[:16] != folder.name:
            return (
                f"{metadata.path}: its content hashes to {metadata.sha256[:16]} but its folder is named "
                f"{folder.name}: the file was edited or the folder renamed, so which settings produced "
                "these rows is unknown. Restore the original metadata.json (whose hash the folder is named by)"
            )
    if tree is not None and metadata.form in (MetadataForm.S3, MetadataForm.S2):
        recorded = (metadata.provider, metadata.model)
        if recorded != (tree.provider, tree.model):
            return (
                f"{metadata.path}: records provider/model {recorded[0]}/{recorded[1]} but lies under "
                f"{tree.provider}/{tree.model}: the folder was moved. Move it back under {recorded[0]}/{recorded[1]}"
            )
    return None
