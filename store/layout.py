"""Where a descriptor's database lives, every file name of a store, and how to find and select databases.

Contract::

    {store_root}/{role}/{task}/{provider}/{model}/{descriptor_hash16}/
        metadata.json                    descriptor, its full hash, role and task
        {role}.db                        the SQLite database
        {role}.db-wal, {role}.db-shm     SQLite's side files (WAL mode)
        {role}.db-journal                the rollback journal (rollback mode): never to be deleted
        {role}.db.lock                   held while the database is created, upgraded or vacuumed
        {role}.db.bak-{revision}-{time}  the byte-for-byte copy an upgrade keeps
                                         (copied under a temporary name, then
                                         renamed: a complete copy or none)
    {store_root}/.judgestore-sync/       sharing's workspace (store.sync.workspace)

* Each name is one folder name, percent-encoded and, when too long for a
  file name, shortened (:mod:`store.segments`). The whole name is in the
  folder's metadata.json: walking a store reads it there
  (:meth:`Location.from_db_path`), so listings show the whole name, and a
  name known only by its segment (a remote's listing, a metadata.json that
  cannot be read) is a :class:`~store.segments.ShortName`, which selectors
  and the metadata checks compare by segment.
* ``metadata.json`` is written atomically (temporary file, fsync, rename) and
  its bytes are deterministic for a descriptor. :func:`read_metadata` refuses a
  folder whose name is not the hash of the descriptor it holds.
* Nothing above this module builds paths or file names: callers pass a
  :class:`Location` or use the functions here (:func:`wal_path`,
  :func:`lock_path`, :func:`backup_path`, :func:`database_files`...).
* A :class:`Selector` picks *databases* by their location (role, task,
  provider, descriptor model, descriptor hash prefix); :func:`select` lists
  the ones under a root. Selecting databases never selects rows
  (:class:`~store.tables.filters.RowFilter` does).
"""

from __future__ import annotations

import errno
import functools
import os
import shlex
import stat
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import ValidationError

from store.descriptor import HASH16_LENGTH, ModelDescriptor, sha256_hex
from store.errors import DatabaseIOError, InvalidInputError, MetadataMismatchError, MetadataMissingError
from store.roles import ROLES, Role, check_role
from store.segments import ShortName, decode_segment, encode_segment, same_name

LEVELS = ("role", "task", "provider", "model", "descriptor")  # the folder levels of a descriptor folder
METADATA_FILE = "metadata.json"
METADATA_TEMP_PREFIX = ".metadata."  # a metadata.json being written (left behind only by a crash)
BACKUP_TEMP_PREFIX = ".backup."  # a backup being copied (left behind only by a crash); never a backup's name
SYNC_FOLDER = ".judgestore-sync"  # sharing's workspace at the store root (store.sync.workspace)
METADATA_FORMAT = "judgestore-metadata/v1"
WAL_SUFFIX, SHM_SUFFIX, JOURNAL_SUFFIX = "-wal", "-shm", "-journal"
SQLITE_SIDE_SUFFIXES = (WAL_SUFFIX, SHM_SUFFIX, JOURNAL_SUFFIX)  # files SQLite keeps beside a database
LOCK_SUFFIX = ".lock"
BACKUP_INFIX = ".bak-"
_DESCRIPTOR_FIELDS = frozenset(ModelDescriptor.model_fields)  # what a canonical descriptor may hold


@dataclass(frozen=True, slots=True)
class Location:
    """The address of one descriptor database inside a store root."""

    role: Role
    task: str
    provider: str
    model: str
    descriptor_hash16: str

    @classmethod
    def of(cls, role: str, task: str, descriptor: ModelDescriptor) -> Location:
        if not isinstance(descriptor, ModelDescriptor):  # a dict of its fields, say: AttributeError further on
            raise InvalidInputError(
                f"descriptor must be a ModelDescriptor, got {type(descriptor).__name__} {descriptor!r:.60}"
            )
        if not isinstance(task, str):
            raise InvalidInputError(f"task must be text, got {type(task).__name__} {task!r:.60}")
        location = cls(check_role(role), task, descriptor.provider, descriptor.model, descriptor.hash16())
        location.segments()  # validates every segment now, not at first use
        return location

    def segments(self) -> tuple[str, str, str, str, str]:
        """The folder names from the store root down to the descriptor folder."""
        return (
            self.role,
            encode_segment(self.task),
            encode_segment(self.provider),
            encode_segment(self.model),
            encode_segment(self.descriptor_hash16),
        )

    def relative_folder(self) -> Path:
        return _relative_folder(self)

    def folder(self, root: Path) -> Path:
        return _folder(self, root)

    def db_path(self, root: Path) -> Path:
        return _db_path(self, root)

    def metadata_path(self, root: Path) -> Path:
        return self.folder(root) / METADATA_FILE

    def selector_options(self) -> str:
        """The CLI options that pick this database alone (``--role``, ``--task``, ``--descriptor``), for advice to
        print: an input hash alone picks its rows in every database that holds the same input."""
        return f"--role {self.role} --task {shlex.quote(self.task)} --descriptor {self.descriptor_hash16}"

    def as_dict(self, *, model_key: str = "model") -> dict[str, str]:
        """The location as ``--json`` outputs show it (rows name it ``descriptor_model``: ``model`` is theirs)."""
        return {"role": self.role, "task": self.task, "provider": self.provider, model_key: self.model,
                "descriptor": self.descriptor_hash16}  # fmt: skip

    @classmethod
    def from_db_path(cls, root: Path, db_path: Path) -> Location:
        """Parse ``{root}/{role}/{task}/{provider}/{model}/{hash16}/{role}.db``.

        Shortened names are read from the folder's metadata.json; where it cannot be read (or
        does not match), they stay :class:`ShortName` and the metadata checks report the folder.
        """
        parts = db_path.relative_to(root).parts
        if len(parts) != 6 or parts[0] not in ROLES or parts[5] != database_name(parts[0]):
            raise InvalidInputError(f"{db_path} is not a descriptor database path under {root}")
        role, task, provider, model, hash16 = parts[0], *map(decode_segment, parts[1:5])
        location = cls(check_role(role), task, provider, model, hash16)
        shortened = any(isinstance(name, ShortName) for name in (task, provider, model))
        return location._resolved(db_path.parent) if shortened else location

    def _resolved(self, folder: Path) -> Location:
        """This location with its shortened names replaced by the whole names its metadata.json records."""
        try:
            metadata = read_metadata(folder)
        except (MetadataMissingError, MetadataMismatchError, OSError):
            return self
        whole = Location(self.role, metadata.task, metadata.descriptor.provider, metadata.descriptor.model,
                         self.descriptor_hash16)  # fmt: skip
        return whole if whole.relative_folder() == self.relative_folder() else self


# Remembered: a listing of thousands of databases asks each for its path several times (the catalog, the file's
# state, its metadata), and each time costs five encoded segments. Joined as strings, one Path built per path:
# pathlib's joins parse every part again, a third of what listing 5,000 databases cost.
@functools.lru_cache(maxsize=1 << 16)
def _relative_folder(location: Location) -> Path:
    return Path(os.path.join(*location.segments()))


@functools.lru_cache(maxsize=1 << 16)
def _folder(location: Location, root: Path) -> Path:
    return Path(os.path.join(root, *location.segments()))


@functools.lru_cache(maxsize=1 << 16)
def _db_path(location: Location, root: Path) -> Path:
    return Path(os.path.join(root, *location.segments(), database_name(location.role)))


# ---------------------------------------------------------------- file names


def database_name(role: str) -> str:
    return f"{role}.db"


def wal_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + WAL_SUFFIX)


def shm_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + SHM_SUFFIX)


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + LOCK_SUFFIX)


def backup_path(db_path: Path, revision: str | None, stamp: str) -> Path:
    """Where an upgrade keeps the copy of ``db_path`` it makes at ``revision`` (``stamp``: a UTC time)."""
    return db_path.with_name(f"{db_path.name}{BACKUP_INFIX}{revision}-{stamp}")


def backup_temp_path(backup: Path) -> Path:
    """Where the copy that becomes ``backup`` is written first (same folder: the rename is atomic)."""
    return backup.with_name(f"{BACKUP_TEMP_PREFIX}{backup.name}.{uuid.uuid4().hex}.tmp")


def is_backup_of(name: str, db_name: str) -> bool:
    return name.startswith(db_name + BACKUP_INFIX)


def descriptor_folder_names(role: str) -> frozenset[str]:
    """The names a descriptor folder may hold besides backups (see the module docstring)."""
    db_name = database_name(role)
    sides = (db_name + suffix for suffix in (*SQLITE_SIDE_SUFFIXES, LOCK_SUFFIX))  # -journal too: see above
    return frozenset({METADATA_FILE, db_name, *sides})


def database_files(db_path: Path) -> list[Path]:
    """The files holding a database's rows: the database and its WAL, those that exist."""
    return [p for p in (db_path, wal_path(db_path)) if p.exists()]


def database_size(db_path: Path) -> int:
    """Bytes on disk of a database and its write-ahead log."""
    return sum(p.stat().st_size for p in database_files(db_path))


def sync_folder(root: Path) -> Path:
    return root / SYNC_FOLDER


@dataclass(frozen=True, slots=True)
class StoredMetadata:
    """What a descriptor folder's metadata.json says."""

    role: Role
    task: str
    descriptor: ModelDescriptor
    descriptor_sha256: str
    assumptions: tuple[str, ...] = ()


def metadata_bytes(role: Role, task: str, descriptor: ModelDescriptor, assumptions: tuple[str, ...] = ()) -> bytes:
    """Deterministic metadata.json bytes: the same descriptor gives the same bytes."""
    doc: dict[str, object] = {
        "format": METADATA_FORMAT,
        "role": role,
        "task": task,
        "descriptor": orjson.loads(descriptor.canonical_json()),
        "descriptor_sha256": descriptor.sha256(),
    }
    if assumptions:
        doc["assumptions"] = list(assumptions)
    # Its keys sorted, and the descriptor's as it hashes them: a setting's value keeps its own order, which counts
    return orjson.dumps(dict(sorted(doc.items())), option=orjson.OPT_INDENT_2) + b"\n"


def write_metadata(folder: Path, data: bytes) -> None:
    """Write metadata.json atomically: readers see the old file or the new one.

    On failure (a full or read-only disk) nothing is left behind: neither the
    temporary file nor the folders this call created.
    """
    created = [f for f in (folder, *folder.parents) if not f.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{METADATA_TEMP_PREFIX}{uuid.uuid4().hex}.tmp"
        # Mode 0666 less the umask, as any file the user writes: colleagues sharing the store read it.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, folder / METADATA_FILE)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except BaseException:
        for made in created:  # deepest first; a folder another process filled meanwhile stays
            try:
                made.rmdir()
            except OSError:
                break
        raise


def parse_metadata(data: bytes, where: Path | str) -> tuple[StoredMetadata, str]:
    """The metadata.json document ``data`` (a file's, or a server registry's copy) and the hash it records.

    The returned record holds the hash the descriptor really has; the caller compares the recorded one with it
    (and with the folder's name, or the registry's row). What is not a judgestore metadata.json is refused
    with :class:`MetadataMismatchError` naming ``where``.
    """
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise MetadataMismatchError(where, f"not valid JSON ({e})") from e
    try:
        descriptor = ModelDescriptor.model_validate(doc["descriptor"])
        stored_hash = str(doc["descriptor_sha256"])
        role, task = check_role(doc["role"]), doc["task"]
        assumptions = tuple(doc.get("assumptions", ()))
    except (KeyError, TypeError, ValidationError, InvalidInputError) as e:
        raise MetadataMismatchError(where, f"not a judgestore {METADATA_FILE} ({e})") from e
    return StoredMetadata(role, task, descriptor, descriptor.sha256(), assumptions), stored_hash


def read_metadata(folder: Path) -> StoredMetadata:
    """Read and verify a folder's metadata.json against the folder's name."""
    path = folder / METADATA_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise MetadataMissingError(path, "missing; this folder was not written by judgestore") from e
    except IsADirectoryError as e:  # judgestore writes a file: something else put a folder there
        raise MetadataMissingError(path, "is a folder, not the file judgestore writes there (made by hand)") from e
    metadata, stored_hash = parse_metadata(data, path)
    actual = metadata.descriptor_sha256
    if stored_hash != actual or folder.name != actual[:16]:
        raise MetadataMismatchError(
            path,
            f"descriptor hashes to {actual[:16]} but the folder is named {folder.name} "
            f"and the file records {stored_hash[:16]}; the file was edited or moved. "
            "Restore it or move the folder to the name of its hash "
            "(`judgestore verify` lists every such folder).",
        )
    return metadata


def read_location_metadata(root: Path, location: Location) -> StoredMetadata:
    """Read a descriptor folder's metadata.json and check it against the whole location.

    :func:`read_metadata` checks that the folder is named after the
    descriptor's hash; this also checks that the folder lies under the role,
    task, provider and model the file records (a folder moved by hand keeps
    its hash but not its meaning).
    """
    folder = location.folder(root)
    metadata = read_metadata(folder)
    recorded = (metadata.role, metadata.task, metadata.descriptor.provider, metadata.descriptor.model)
    actual = (location.role, location.task, location.provider, location.model)
    if Location(*recorded, location.descriptor_hash16).segments() != location.segments():
        raise MetadataMismatchError(
            folder / METADATA_FILE,
            f"records role/task/provider/model {'/'.join(recorded)} but the folder lies under "
            f"{'/'.join(actual)}; the folder was moved. Move it back under {'/'.join(recorded)} "
            "(percent-encoded), or delete it",
        )
    return metadata


def check_location_metadata(root: Path, location: Location) -> None:
    """Raise what :func:`read_location_metadata` raises for ``location``, without building the descriptor when
    it need not (every open of a database runs this).

    A metadata.json as :func:`metadata_bytes` writes it holds the descriptor in
    its canonical form: hashing that form as it stands gives the hash recorded
    beside it and the folder's name, and its role, task, provider and model
    name the folders above. Such a file is accepted on those facts; any other
    file (edited, moved, written in another form) gets the full check.
    """
    folder = location.folder(root)
    try:
        doc = orjson.loads((folder / METADATA_FILE).read_bytes())
        descriptor = doc["descriptor"]
        if type(descriptor) is dict and descriptor.keys() <= _DESCRIPTOR_FIELDS:
            digest = sha256_hex(orjson.dumps(descriptor))  # the canonical form, as it stands (a value's own order)
            recorded = Location(doc["role"], doc["task"], descriptor["provider"], descriptor["model"], folder.name)
            if (
                digest == doc["descriptor_sha256"]
                and digest[:16] == folder.name
                and recorded.segments() == location.segments()
            ):
                return
    except (OSError, ValueError, KeyError, TypeError, InvalidInputError):
        pass  # the full check says what is wrong
    read_location_metadata(root, location)


def prepared_folder(root: Path, location: Location, metadata: Callable[[], bytes] | None = None) -> Path:
    """The folder of ``location``, its metadata.json as it must be, for opening the database inside.

    Given ``metadata`` (a read-write open), a folder without metadata.json is
    created with ``metadata()`` written into it (:func:`write_metadata`: what
    was just written from the descriptor needs no check); any other folder's
    file is checked (:func:`check_location_metadata`). A failing disk raises
    its ``OSError``.
    """
    folder = location.folder(root)
    if metadata is not None and not (folder / METADATA_FILE).exists():
        write_metadata(folder, metadata())
    else:
        check_location_metadata(root, location)
    return folder


def walk(root: Path, selector: Selector | None = None) -> Iterator[Location]:
    """Every descriptor database under ``root`` (those ``selector`` may pick), in sorted order.

    Paths that do not parse as a location (stray files, foreign folders) are
    skipped here, their folders never looked into; ``judgestore verify``
    reports them. With ``selector``, only the folders its role, task,
    provider, model and descriptor prefix can match are looked into. A folder
    looked into that this user cannot list is a :class:`DatabaseIOError`
    (:func:`_folders`).
    """
    selector = selector or Selector()
    prefix = (selector.descriptor or "")[:HASH16_LENGTH]  # a folder's name; a longer prefix is the caller's
    for role in ROLES if selector.role is None else (selector.role,):
        name = database_name(role)
        found = []
        # Folder by folder with os.scandir (its d_type, no stat per entry) rather than Path.glob: the same paths
        # (a name starting with a dot included, as pathlib's "*" does), about 3x faster over thousands of databases.
        for task in _folders(os.path.join(root, role), selector.task):
            for provider in _folders(task, selector.provider):
                for model in _folders(provider, selector.model):
                    for descriptor in _folders(model):
                        if os.path.basename(descriptor).startswith(prefix) and _holds(descriptor, name):
                            found.append(descriptor)
        base = len(str(root)) + len(role) + 2
        for folder in sorted(found, key=lambda path: path[base:].split(os.sep)):  # Path order: part by part
            task, provider, model, hash16 = folder[base:].split(os.sep)
            try:
                location = Location(role, decode_segment(task), decode_segment(provider), decode_segment(model),
                                    decode_segment(hash16))  # fmt: skip
                if any(isinstance(n, ShortName) for n in (location.task, location.provider, location.model)):
                    location = location._resolved(Path(folder))
            except InvalidInputError:
                continue
            yield location


def enclosing_store(root: Path) -> Path | None:
    """The store whose role, task, provider, model or descriptor folder ``root`` is, links followed (it holds that
    store's databases as deep as the layout puts them below that folder), or None. Only a path with a role's name
    among its last five parts is looked at, only the first database found under it, and not a store's own root
    (:func:`_holds_a_store`: one named after a role, or inside a folder that is, found at its first database)."""
    real = Path(os.path.realpath(root))
    parts = real.parts
    if not any(part in ROLES for part in parts[-5:]) or _holds_a_store(real):
        return None
    for depth in range(1, min(6, len(parts))):
        role = parts[-depth]
        if role not in ROLES:
            continue
        store = Path(*parts[:-depth])
        pattern = "/".join(["*"] * (5 - depth) + [database_name(role)])  # the folders left down to the database
        found = next(real.glob(pattern), None)
        if found is None:
            continue
        try:
            Location.from_db_path(store, found)
        except InvalidInputError:
            continue
        return store
    return None


def _holds_a_store(folder: Path) -> bool:
    """Whether ``folder`` is a store's root: a role folder of it holds a database as deep as the layout puts one
    (a task, provider or model named like a role holds none there)."""
    return any(next((folder / role).glob("*/*/*/*/" + database_name(role)), None) is not None for role in ROLES)


def _folders(path: str, wanted: str | None = None) -> list[str]:
    """The folders in ``path`` whose names are layout segments (``wanted``'s, if given), as paths; none when it is
    no folder. A folder this user may not list (or that the disk fails to read) is a :class:`DatabaseIOError`:
    the databases in it would be missing from every command, a delete leaving their rows (it read as an empty
    store). An entry that cannot be looked at (a link into a folder this user may not enter, a loop of links)
    is no folder of the layout: ``judgestore verify`` reports it."""
    try:
        with os.scandir(path) as entries:
            names = [(e.name, e.path) for e in entries if _is_folder(e)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise _unlistable(path, e) from None
    return [folder for name, folder in names if _is_segment(name, wanted)]


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _is_segment(name: str, wanted: str | None) -> bool:
    """Whether a folder named ``name`` can hold a location (``wanted``'s, if given)."""
    try:
        segment = decode_segment(name)
    except InvalidInputError:
        return False
    return wanted is None or same_name(wanted, segment)


def _holds(folder: str, name: str) -> bool:
    """Whether ``folder`` holds the file ``name``; a folder this user may not look into is a
    :class:`DatabaseIOError` (see :func:`_folders`). A link there that leads nowhere (broken, a loop, into a
    closed folder) holds none: ``judgestore verify`` reports it."""
    path = os.path.join(folder, name)
    try:
        entry = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise _unlistable(folder, e) from None
    return not stat.S_ISLNK(entry.st_mode) or os.path.exists(path)


def _unlistable(path: str, error: OSError) -> DatabaseIOError:
    """The error of a folder :func:`_folders` cannot list, naming the folder to fix: for a permission, the
    outermost of those above it this user may not enter (a store root closed to it, not the role folder in it)."""
    denied = error.errno in (errno.EACCES, errno.EPERM)
    said = "permission denied" if denied else (error.strerror or str(error))
    if denied and os.access in os.supports_effective_ids:  # as the process's user (tests run as root, acting as nobody)
        parent = os.path.dirname(path)
        while parent != path and not os.access(parent, os.X_OK, effective_ids=True):
            path, parent = parent, os.path.dirname(parent)
    advice = (
        "Fix its permissions (a reader needs r and x on every folder of the store), or run as a user who may read it"
        if denied
        else "Check the disk and the path (`judgestore verify`)"
    )
    return DatabaseIOError(
        path,
        f"{said}: this user cannot look into the folder, so the databases in it cannot be found and nothing "
        f"was done. {advice}",
    )


# ---------------------------------------------------------------- selecting databases


@dataclass(frozen=True, slots=True, kw_only=True)
class Selector:
    """Databases whose location equals every field that is set.

    ``descriptor`` is a prefix of the folder name (the descriptor hash's first
    16 hex characters); a longer one, up to the full 64-character hash, is
    compared whole by :meth:`store.store.Store.select`, with the hash the
    folder's metadata records (here only its first 16 characters are).
    """

    role: Role | None = None
    task: str | None = None
    provider: str | None = None
    model: str | None = None
    descriptor: str | None = None

    def __post_init__(self) -> None:
        if self.role is not None:
            check_role(self.role)
        if self.descriptor is not None and not (
            self.descriptor and all(c in "0123456789abcdef" for c in self.descriptor)
        ):
            raise InvalidInputError(f"descriptor must be lowercase hex (a hash prefix), got {self.descriptor!r}")

    @classmethod
    def of(cls, role: str, task: str, descriptor: ModelDescriptor) -> Selector:
        """Exactly the folder of one descriptor (what a run reads and writes)."""
        location = Location.of(role, task, descriptor)
        return cls(role=location.role, task=location.task, provider=location.provider, model=location.model,
                   descriptor=location.descriptor_hash16)  # fmt: skip

    def matches(self, location: Location) -> bool:
        return (
            (self.role is None or location.role == self.role)
            and (self.task is None or same_name(self.task, location.task))
            and (self.provider is None or same_name(self.provider, location.provider))
            and (self.model is None or same_name(self.model, location.model))
            and (self.descriptor is None or location.descriptor_hash16.startswith(self.descriptor[:16]))
        )

    def is_empty(self) -> bool:
        return all(value is None for value in self.as_dict().values())

    def as_dict(self) -> dict[str, str | None]:
        return {"role": self.role, "task": self.task, "provider": self.provider, "model": self.model,
                "descriptor": self.descriptor}  # fmt: skip


def select(root: Path, selector: Selector | None = None) -> list[Location]:
    """Every descriptor database under ``root`` that ``selector`` picks, in walk order."""
    selector = selector or Selector()
    return [location for location in walk(root, selector) if selector.matches(location)]
