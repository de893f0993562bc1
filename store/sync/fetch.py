"""Fetch: import the shards of a remote that this store has not imported yet, trusting nothing.

Protocol of one fetch (under the store root's sync lock):

1. **Pin** the remote's head (a commit id on the Hub), so every listing and
   download sees one state, however many pushes land meanwhile.
2. **List only what the selector picks**: level by level (role, task,
   provider, model, descriptor), a fixed filter becomes a path segment and
   an open level is listed; below the last filter one recursive listing per
   folder. Every listed path is parsed as untrusted
   (:func:`store.sync.remote_layout.parse_remote_path`); anything else is reported
   and never read.
3. **Per folder, in sorted order**: skip it if every shard is already
   imported (or was pushed from here) and the folder is still in the store
   (one deleted since, or a schema dropped, is fetched again whole, what the
   bookkeeping says of it notwithstanding). Otherwise read its metadata.json and
   accept it only if it is byte-identical to what this library writes for the
   descriptor it holds, under the folder's name, role, task, provider and
   model.
4. **Per shard, in sorted name order** (so every store converges on the same
   rows): download it (a few at once, size capped) and validate *all* of it
   (:func:`store.sync.shards.read_shard`). Only then import: the valid shards
   of a small group have their keys recorded as fetched (so a push never
   echoes them back), their rows inserted in one transaction with INSERT OR
   IGNORE in name order (a row already here, local or fetched, wins), and are
   then recorded as imported. A shard or metadata.json that fails validation
   is quarantined under ``.judgestore-sync/quarantine`` and reported; a
   download that keeps failing is reported and tried again by the next fetch.
   Neither stops the other shards. A group whose import the store refuses
   (busy, full) is reported whole, as its one transaction was: once a part of
   it (a group of wide rows is imported in parts) is refused, the rest of the
   group is reported not imported, and the next fetch takes them. A server
   store that cannot be used at all (down, or refusing the login:
   :data:`~store.errors.STORE_UNUSABLE`) stops the fetch there, noting what
   was imported before it, rather than fail every later group after waiting
   out its retries.

The remote is recorded in the bookkeeping with the first shard fetched from
it: a fetch that fails (a repository the Hub answers with 404) or a dry run
leaves the bookkeeping as it was.

Whatever revision a fetch is made at, its shards are recorded under the
repository (so a later fetch at another revision skips them and a push never
echoes their rows), together with whether that revision was the repository's
default branch (:func:`store.sync.remote.at_default`): a row fetched at a
branch, tag or commit is still sent by a push to ``main`` unless ``main``
lists a shard holding it. A fetch from the default branch also records that
the shards it lists and skips are on it (a local write, only when that is
news), which spares the next push to ``main`` the question.

Crash safety: the bookkeeping lives in its own file, so the import and the
"imported" mark are two commits. The import is idempotent (INSERT OR IGNORE
of the same validated rows), so a crash between them only means the next
fetch downloads the shard again and inserts nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from store import jsonvalues
from store.descriptor import HASH16_LENGTH
from store.errors import (
    STORE_UNUSABLE,
    JudgestoreError,
    RemoteAuthError,
    RemoteError,
    RemoteMetadataError,
    ShardError,
    UntrustedContentError,
)
from store.interrupts import carrying
from store.layout import LEVELS, Location, Selector, StoredMetadata
from store.reports import DatabaseInfo
from store.repository import records_bytes
from store.roles import ROLES
from store.schema import DatabaseState
from store.segments import encode_segment
from store.settings import SyncSettings, from_environment
from store.store import Database, Store
from store.sync.bookkeeping import Bookkeeping, NewShard, ShardState
from store.sync.remote import Remote, at_default, check_outside_store
from store.sync.remote_layout import (
    METADATA_MAX_BYTES,
    folder_segment,
    metadata_path,
    parse_remote_path,
    remote_folder,
    shard_path,
    verify_remote_metadata,
)
from store.sync.shards import Shard, ShardOrigin, read_shard
from store.sync.workspace import ProgressCallback, SyncProblem, no_progress, preview_root, quarantine, sync_lock
from store.tables.records import Record

DONE_STATES = (ShardState.PUSHED, ShardState.IMPORTED)  # shards whose rows this store already has
DOWNLOAD_WORKERS = 4  # downloads are latency bound: a few at once
GROUP_SHARDS = 8  # shards validated, then imported in one transaction...
GROUP_BYTES = 32 * 1024 * 1024  # ...as long as their compressed sizes add up to no more than this
IMPORT_BYTES = 64 * 1024 * 1024  # and a group's rows are imported once they take about this much memory
IMPORT_STOPPED = "a part of its group before it could not be imported (the group is imported whole)"


@dataclass(slots=True)
class RemoteFolder:
    """A descriptor folder as listed on the remote: whether it has a metadata.json, and its shards' sizes."""

    location: Location
    has_metadata: bool = False
    shards: dict[str, int | None] = field(default_factory=dict)


@dataclass(slots=True)
class FetchedFolder:
    """What a fetch imported (or, in a dry run, would download) for one descriptor folder."""

    location: Location
    shards: int = 0
    rows_read: int = 0  # rows in the imported shards
    rows_inserted: int = 0  # rows that were new here (the rest were already present and kept)
    bytes: int = 0
    conflicts: int = 0  # rows read whose key holds another answer here (or earlier in the same fetch): not imported

    def as_dict(self, *, downloaded: bool = True) -> dict[str, Any]:
        """As JSON; rows are None unless ``downloaded`` (a dry run cannot count them)."""
        rows = (self.rows_read, self.rows_inserted, self.conflicts) if downloaded else (None, None, None)
        counts = {"shards": self.shards, "rows_read": rows[0], "rows_inserted": rows[1], "conflicts": rows[2]}
        return {**self.location.as_dict(), **counts, "bytes": self.bytes}


@dataclass(slots=True)
class FetchReport:
    """The outcome of :func:`fetch`. ``ok`` is false if anything was rejected, quarantined or failed."""

    remote: str
    revision: str | None
    dry_run: bool
    folders: list[FetchedFolder] = field(default_factory=list)
    skipped: int = 0  # shards already imported here (or pushed from here)
    quarantined: list[SyncProblem] = field(default_factory=list)  # read, failed validation, kept aside
    failed: list[SyncProblem] = field(
        default_factory=list
    )  # could not be downloaded or imported now; retried next time
    rejected_paths: list[SyncProblem] = field(default_factory=list)  # listed paths that are not judgestore's layout
    folders_matched: int = 0  # the remote's descriptor folders the selection picks (0: none there, a mistyped --task)

    @property
    def shards(self) -> int:
        return sum(f.shards for f in self.folders)

    @property
    def rows(self) -> int:
        return sum(f.rows_inserted for f in self.folders)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.folders)

    @property
    def conflicts(self) -> int:
        return sum(f.conflicts for f in self.folders)

    @property
    def ok(self) -> bool:
        return not (self.quarantined or self.failed or self.rejected_paths)

    def as_dict(self) -> dict[str, Any]:
        return {
            "remote": self.remote,
            "revision": self.revision,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "shards": self.shards,
            # a dry run downloads no shard, so it cannot count their rows: null, not a 0 to be misread
            "rows_read": None if self.dry_run else sum(f.rows_read for f in self.folders),
            "rows_inserted": None if self.dry_run else self.rows,
            "conflicts": None if self.dry_run else self.conflicts,
            "bytes": self.bytes,
            "skipped": self.skipped,
            "folders_matched": self.folders_matched,
            "folders": [f.as_dict(downloaded=not self.dry_run) for f in self.folders],
            "quarantined": [p.as_dict() for p in self.quarantined],
            "failed": [p.as_dict() for p in self.failed],
            "rejected_paths": [p.as_dict() for p in self.rejected_paths],
        }


def fetch(
    store: Store,
    remote: Remote,
    selector: Selector | None = None,
    *,
    dry_run: bool = False,
    max_shard_bytes: int | None = None,
    progress: ProgressCallback = no_progress,
) -> FetchReport:
    """Import the selected folders' new shards from ``remote`` into ``store`` (see the module docstring).

    ``max_shard_bytes``: the largest shard accepted; None, the ``JUDGESTORE_MAX_SHARD_BYTES`` setting
    (:class:`~store.settings.SyncSettings`), as the command line and a run's fetch before it read it.

    A ``KeyboardInterrupt`` (Ctrl-C) gets ``fetch_report``, the report so far: the shards imported before it
    (committed; the last group may not be recorded as imported yet, and the rerun imports it again, writing
    nothing). Downloads not yet started are dropped; the same fetch run again skips what was recorded as imported
    and fetches the rest.
    """
    selector = selector or Selector()
    if max_shard_bytes is None:
        max_shard_bytes = from_environment(SyncSettings).max_shard_bytes
    check_outside_store(remote, store.root)
    revision = remote.head()  # a remote that is not there (or refuses us) is said before anything is created here
    with (
        preview_root(store.root, dry_run) as root,
        sync_lock(root),
        Bookkeeping(root, settings=store.settings) as books,
    ):
        report = FetchReport(remote.url, revision, dry_run)
        with carrying("fetch_report", report):  # what was imported before a Ctrl-C, for the CLI
            return _fetch(store, remote, selector, books, report, max_shard_bytes, progress)


def _fetch(
    store: Store,
    remote: Remote,
    selector: Selector,
    books: Bookkeeping,
    report: FetchReport,
    max_shard_bytes: int,
    progress: ProgressCallback,
) -> FetchReport:
    """:func:`fetch` itself, filling ``report`` as it goes (so that an interrupt can tell what was imported)."""
    revision, dry_run = report.revision, report.dry_run
    folders = discover(remote, revision, selector, report.rejected_paths)
    prefix = selector.descriptor or ""
    if len(prefix) > HASH16_LENGTH:  # compared whole, as Store.select does: with the hash metadata.json records
        folders = {key: f for key, f in folders.items() if _describes(remote, revision, f, prefix)}
    report.folders_matched = len(folders)
    # Looked up, not recorded: the remote is recorded with the first shard fetched from it, so a fetch that
    # fails or a dry run leaves the bookkeeping as it was.
    known_id = books.find_remote(remote.url)
    default = at_default(remote)
    local = _local_databases(store, folders)
    # A folder deleted here since (or a schema dropped) lost the rows its shards brought: they are fetched again,
    # whatever the bookkeeping recorded of them (rows already there are kept, as ever).
    here = (
        {key for key, info in local.items() if info.state is not DatabaseState.EMPTY} if known_id is not None else set()
    )
    work: list[tuple[RemoteFolder, list[str]]] = []
    for key in sorted(folders):
        listed = folders[key]
        if default and known_id is not None and not dry_run:
            # Shards recorded from another revision that the default branch lists are on it: say so now, so a
            # push to it need not ask (the shards are skipped below, never recorded again).
            books.mark_on_default(known_id, key, listed.shards)
        states = books.states(known_id, key) if known_id is not None and key in here else {}
        todo = sorted(name for name in listed.shards if states.get(name) not in DONE_STATES)
        report.skipped += len(listed.shards) - len(todo)
        if todo:
            work.append((listed, todo))
    total = sum(len(todo) for _, todo in work)
    if dry_run:
        for listed, todo in work:
            key = remote_folder(listed.location)
            if key in local and not _takes_rows(local[key], store):  # as the fetch will find it, downloading nothing
                report.failed.append(SyncProblem(key, f"local database cannot take rows: {local[key].error}"))
                continue
            size = sum(listed.shards[name] or 0 for name in todo)
            report.folders.append(FetchedFolder(listed.location, shards=len(todo), bytes=size))
        return report
    if not work:
        return report
    remote_id = books.remote_id(remote.url)
    with ThreadPoolExecutor(DOWNLOAD_WORKERS, thread_name_prefix="judgestore-fetch") as pool:
        importer = ShardImporter(store, remote, revision, books, remote_id, max_shard_bytes, report, pool)
        try:
            for listed, todo in work:
                importer.folder(listed, todo, lambda n: progress("Downloading", n, total))
        except BaseException as e:  # Ctrl-C, a server gone: queued downloads are dropped, not waited for
            pool.shutdown(wait=False, cancel_futures=True)
            if isinstance(e, STORE_UNUSABLE) and report.shards:
                shards, rows = report.shards, sum(f.rows_read for f in report.folders)
                e.add_note(
                    f"Before it, {shards:,} shard{'s' * (shards != 1)} ({rows:,} row{'s' * (rows != 1)}) "
                    f"{'were' if shards != 1 else 'was'} imported (kept): run the same fetch again once the server "
                    "answers, which fetches the rest"
                )
            raise
    return report


def _local_databases(store: Store, folders: dict[str, RemoteFolder]) -> dict[str, DatabaseInfo]:
    """What this store holds of the remote's folders, by folder: a server's schema dropped by hand stays in its
    registry (and an emptied folder's file may stay) as an empty database, which lost its rows."""
    listed = [location for location in store.locations() if remote_folder(location) in folders]
    return {remote_folder(info.location): info for info in store.infos(listed, count_rows=False)}


def _takes_rows(info: DatabaseInfo, store: Store) -> bool:
    """Whether the fetch can write to the database: a usable one, or one behind that it upgrades first."""
    return info.ok or (info.state is DatabaseState.BEHIND and store.settings.auto_upgrade)


def discover(
    remote: Remote, revision: str | None, selector: Selector, rejected: list[SyncProblem]
) -> dict[str, RemoteFolder]:
    """The descriptor folders on the remote that ``selector`` picks, listing only below what it fixes."""
    filters: list[str | None] = [selector.role, selector.task, selector.provider, selector.model, selector.descriptor]
    prefixes: list[tuple[str, ...]] = [()]
    depth = 0
    while depth < len(LEVELS) and any(value is not None for value in filters[depth:]):
        value = filters[depth]
        deeper: list[tuple[str, ...]] = []
        for segments in prefixes:
            fixed = _fixed_segment(LEVELS[depth], value)
            if fixed is not None:  # nothing to list: the filter names the folder
                deeper.append((*segments, fixed))
                continue
            for entry in remote.list("/".join(segments), revision=revision, recursive=False):
                name = _child_name(entry.path, segments, rejected)
                if name is None or not entry.is_dir:
                    if name is not None and depth > 0:
                        rejected.append(SyncProblem(entry.path, "a file where only descriptor folders belong"))
                    continue
                if depth == 0 and name not in ROLES:
                    continue  # README.md, .gitattributes and other top-level entries are not ours to judge
                try:
                    folder_segment(LEVELS[depth], name, entry.path)
                except UntrustedContentError as e:
                    rejected.append(SyncProblem(e.remote_path, e.reason))
                    continue
                if value is None or name.startswith(value[:16]):
                    deeper.append((*segments, name))
        prefixes = deeper
        depth += 1
    folders: dict[str, RemoteFolder] = {}
    for segments in prefixes:
        prefix = "/".join(segments)
        for entry in remote.list(prefix, revision=revision, recursive=True):
            if entry.is_dir:
                continue
            _add_file(entry.path, entry.size, prefix, selector, folders, rejected)
    return folders


def _describes(remote: Remote, revision: str | None, listed: RemoteFolder, prefix: str) -> bool:
    """Whether the folder's metadata.json records a descriptor hash starting with ``prefix``; True when it cannot
    be read or checked (the import then reports why, as for any folder)."""
    path = metadata_path(listed.location)
    try:
        data = remote.read(path, revision=revision, max_bytes=METADATA_MAX_BYTES)
        return verify_remote_metadata(data, listed.location).descriptor_sha256.startswith(prefix)
    except RemoteAuthError:
        raise
    except (RemoteError, UntrustedContentError, RemoteMetadataError):
        return True


def _fixed_segment(level: str, value: str | None) -> str | None:
    """The path segment a filter pins at ``level``, or None when the level must be listed and matched."""
    if value is None or (level == "descriptor" and len(value) < HASH16_LENGTH):  # a hash prefix: by listing
        return None
    if level == "descriptor":
        return value[:HASH16_LENGTH]
    return value if level == "role" else encode_segment(value)


def _child_name(path: str, segments: tuple[str, ...], rejected: list[SyncProblem]) -> str | None:
    """The last segment of a listed child of ``segments``, or None (reported) if it is not one."""
    parent = "/".join(segments)
    name = path[len(parent) + 1 :] if parent else path
    if (parent and not path.startswith(parent + "/")) or not name or "/" in name:
        rejected.append(SyncProblem(path, f"listed under {parent or '/'} but is not a child of it"))
        return None
    return name


def _add_file(
    path: str,
    size: int | None,
    prefix: str,
    selector: Selector,
    folders: dict[str, RemoteFolder],
    rejected: list[SyncProblem],
) -> None:
    top = path.split("/", 1)[0]
    if not prefix and top not in ROLES and ".." not in path.split("/"):
        return  # top-level files of the repository (README.md, .gitattributes): not part of the layout
    try:
        if prefix and not path.startswith(prefix + "/"):
            raise UntrustedContentError(path, f"listed under {prefix} but lies outside it")
        parsed = parse_remote_path(path)
    except UntrustedContentError as e:
        rejected.append(SyncProblem(path, e.reason))
        return
    if not selector.matches(parsed.location):
        return
    folder = folders.setdefault(remote_folder(parsed.location), RemoteFolder(parsed.location))
    if parsed.shard is None:
        folder.has_metadata = True
    else:
        folder.shards[parsed.shard] = size


class ShardImporter:
    """Downloads, validates and imports the shards of one fetch (the state every folder shares)."""

    def __init__(
        self,
        store: Store,
        remote: Remote,
        revision: str | None,
        books: Bookkeeping,
        remote_id: int,
        max_bytes: int,
        report: FetchReport,
        pool: ThreadPoolExecutor,
    ) -> None:
        self.store, self.remote, self.revision = store, remote, revision
        self.books, self.remote_id, self.max_bytes = books, remote_id, max_bytes
        self.report, self.pool = report, pool
        self.on_default = at_default(remote)  # whether the pinned revision is the repository's default branch
        self.done = 0

    def folder(self, listed: RemoteFolder, todo: Sequence[str], progress: Callable[[int], None]) -> None:
        metadata = self._metadata(listed, len(todo))
        location = listed.location  # its names may be shortened segments; metadata.json has the whole ones
        if metadata is not None:
            location = Location.of(metadata.role, metadata.task, metadata.descriptor)
        database = None
        if metadata is not None:
            try:
                database = self.store.database(
                    metadata.role, metadata.task, metadata.descriptor, assumptions=metadata.assumptions
                )
            except STORE_UNUSABLE:  # the whole store, not this folder: every other would wait out the retries too
                raise
            except JudgestoreError as e:  # the local folder is damaged, behind...: a local problem, per folder
                self.report.failed.append(SyncProblem(remote_folder(location), f"local database cannot take rows: {e}"))
        if metadata is None or database is None:
            self.done += len(todo)
            progress(self.done)
            return
        fetched = FetchedFolder(location)
        try:
            for group in _groups(todo, listed.shards):
                self._group(listed, group, ShardOrigin.of(metadata), database, fetched)
                self.done += len(group)
                progress(self.done)
        finally:  # an interrupt midway still reports the groups imported before it
            if fetched.shards:
                self.report.folders.append(fetched)

    def _metadata(self, listed: RemoteFolder, shards: int) -> StoredMetadata | None:
        """The folder's verified metadata, or None (reported) if it is missing, unreadable or forged."""
        meta_path = metadata_path(listed.location)
        if not listed.has_metadata:
            self.report.failed.append(
                SyncProblem(meta_path, f"missing, so the folder's {shards} shards cannot be checked")
            )
            return None
        try:
            data = self.remote.read(meta_path, revision=self.revision, max_bytes=METADATA_MAX_BYTES)
        except RemoteAuthError:
            raise
        except (RemoteError, UntrustedContentError) as e:
            self.report.failed.append(SyncProblem(meta_path, str(e)))
            return None
        try:
            return verify_remote_metadata(data, listed.location)
        except RemoteMetadataError as e:
            saved = quarantine(self.store.root, self.remote.url, meta_path, data, str(e), self.revision)
            self.report.quarantined.append(
                SyncProblem(meta_path, f"{e.reason}; nothing of this folder is imported", str(saved))
            )
            return None

    def _group(
        self,
        listed: RemoteFolder,
        names: Sequence[str],
        origin: ShardOrigin,
        database: Database,
        fetched: FetchedFolder,
    ) -> None:
        """Download a few shards at once, validate each completely, then import the valid ones in one transaction
        (in several when their rows take over :data:`IMPORT_BYTES`: once one is refused, the rest of the group is
        not imported, as the group's one transaction would not have been)."""
        location = listed.location
        wanted: list[str] = []
        for name in names:
            size = listed.shards[name]
            if size is not None and size > self.max_bytes:
                self.report.rejected_paths.append(
                    SyncProblem(shard_path(location, name), f"is {size:,} bytes, over the cap of {self.max_bytes:,}")
                )
            else:
                wanted.append(name)
        downloads = [
            self.pool.submit(
                self.remote.read, shard_path(location, n), revision=self.revision, max_bytes=self.max_bytes
            )
            for n in wanted
        ]
        valid: list[tuple[Shard, int]] = []
        held = 0
        refused = False  # a part of the group was refused: the rest is not imported either
        for name, download in zip(wanted, downloads, strict=True):
            path = shard_path(location, name)
            if refused:
                download.cancel()
                self.report.failed.append(SyncProblem(path, f"not imported: {IMPORT_STOPPED}; fetch again"))
                continue
            try:
                data = download.result()
            except RemoteAuthError:
                raise
            except (RemoteError, UntrustedContentError) as e:
                self.report.failed.append(SyncProblem(path, str(e)))
                continue
            try:
                shard = read_shard(data, name, origin, where=path, max_bytes=self.max_bytes)
            except ShardError as e:
                saved = quarantine(self.store.root, self.remote.url, path, data, str(e), self.revision)
                self.report.quarantined.append(SyncProblem(path, e.reason, str(saved)))
                continue
            valid.append((shard, len(data)))
            held += records_bytes(shard.records)
            if held >= IMPORT_BYTES:  # rows that compress well are many more than their compressed size says
                refused = not self._import(valid, location, database, fetched)
                valid, held = [], 0
        if valid:
            self._import(valid, location, database, fetched)

    def _import(
        self, valid: list[tuple[Shard, int]], location: Location, database: Database, fetched: FetchedFolder
    ) -> bool:
        """Import validated shards in one transaction, each whole (see :meth:`_group`); whether they were."""
        folder = remote_folder(location)
        # Keys are known before the rows land: a crash in between must not let a push echo them back.
        self.books.record(
            self.remote_id,
            ShardState.FETCHED,
            [NewShard(folder, shard.name, len(shard.records), size, shard.keys) for shard, size in valid],
            self.revision,
            on_default=self.on_default,
        )
        rows = [r for shard, _ in valid for r in shard.records]
        try:
            # In name order, first occurrence wins: every store that fetches these shards keeps the same rows.
            inserted = database.put_many(rows, on_conflict="ignore")
        except STORE_UNUSABLE:
            raise
        except JudgestoreError as e:
            for shard, _ in valid:
                self.report.failed.append(SyncProblem(shard_path(location, shard.name), f"could not be imported: {e}"))
            return False
        except KeyboardInterrupt:
            # Ctrl-C during the commit lets it finish and is raised just after: the group (one transaction) stands
            # if every row of it is here (how many of them were new is then unknown: counted as none)
            if len(database.get_many(r.input_hash for r in rows)) == len(rows):
                self._count(valid, fetched, inserted=0)
            raise
        # Counted as soon as the rows committed: a Ctrl-C while they are recorded below still counts them (they
        # are here; the rerun imports the group again, writing nothing)
        self._count(valid, fetched, inserted)
        if inserted < len(rows):  # some keys were held already: by the same answer, or by another (a conflict)
            held = database.get_many(r.input_hash for r in rows)
            fetched.conflicts += sum(_answers_apart(r, held[r.input_hash]) for r in rows if r.input_hash in held)
        self.books.set_state(self.remote_id, [(folder, shard.name) for shard, _ in valid], ShardState.IMPORTED,
                             self.revision)  # fmt: skip
        return True

    @staticmethod
    def _count(valid: Sequence[tuple[Shard, int]], fetched: FetchedFolder, inserted: int) -> None:
        fetched.shards += len(valid)
        fetched.rows_read += sum(len(shard.records) for shard, _ in valid)
        fetched.rows_inserted += inserted
        fetched.bytes += sum(size for _, size in valid)


def _answers_apart(fetched: Record, kept: Record) -> bool:
    """Whether a fetched row says something else than the row its key holds here (another lab's sample at a
    temperature above 0, an engine that is not deterministic, or a row refreshed and shared again)."""
    if (fetched.completion, fetched.finish_reason) != (kept.completion, kept.finish_reason):
        return True
    # As stored, not as Python compares them: a NaN logprob is never equal to itself
    return jsonvalues.dumps_bytes(fetched.top_logprobs) != jsonvalues.dumps_bytes(kept.top_logprobs)


def _groups(names: Sequence[str], sizes: dict[str, int | None]) -> list[list[str]]:
    """Consecutive runs of shards small enough to hold in memory together (by listed size)."""
    groups: list[list[str]] = []
    current: list[str] = []
    weight = 0
    for name in names:
        size = sizes.get(name) or 0
        if current and (len(current) >= GROUP_SHARDS or weight + size > GROUP_BYTES):
            groups.append(current)
            current, weight = [], 0
        current.append(name)
        weight += size
    if current:
        groups.append(current)
    return groups
