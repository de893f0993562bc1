"""Push: send a remote the rows it does not have yet, as immutable shards, and record what it confirmed.

Protocol of one push (step 1 before anything is created here, as a fetch
asks first; the others under the store root's sync lock):

1. **Ask the remote.** Its head, or, for a push to a branch that does not
   exist (on the Hub; a folder has no branches), the commit the branch
   would be made from: the repository's default branch head, where the push
   reads (pending shards, listings, metadata.json) what the branch will
   hold. A missing *repository* or folder is the remote's 404 error, said
   before a row is exported or the sync workspace is made.
2. **Settle an interrupted push.** Shards recorded as ``pending`` for this
   remote (built, then the process died or the remote kept failing) are
   looked up on the remote: those there are recorded as pushed, the others
   are forgotten, so their rows count as unsent again.
3. **Export.** For each selected descriptor folder, the local keys the
   remote is not known to have (:mod:`store.sync.bookkeeping`: neither pushed
   there nor fetched from there) are read in key order and cut into shards in
   a staging folder. A folder whose metadata.json on the remote differs from
   ours is reported and skipped: we never rewrite a shared file. On a branch
   that is not the repository's default, the folder's shards are listed on
   the branch first, and a key counts as held only through a recorded shard
   (pushed to the branch, pushed to the repository, or fetched) that the
   branch lists: a row that reached the default branch after the branch was
   made from it is sent to the branch too. On the default branch, a key
   counts as held through a shard known to be on it (pushed to it, fetched
   from it, seen in its listing); a key that only shards fetched at another
   branch, tag or commit hold (or fetched before the bookkeeping told
   revisions apart) is settled by listing the folder's shards on the default
   branch, once: the rows of shards it lists are not sent, the others are,
   and the shards it lists are recorded as on it (not in a dry run). A push
   whose recorded shards were all pushed to or fetched from the default
   branch lists nothing.
4. **Make the branch, record, then send.** Only when there is something to
   send, and never in a dry run (which reports that it would), a missing
   branch is created at the pinned commit; if another pusher made it
   meanwhile and it stands elsewhere, step 3 runs again against the branch
   itself (it need not hold what the pinned commit held). The new shards are
   recorded as ``pending`` with their keys (the remote is recorded with them,
   never before: a push that fails, such as one to a repository the Hub
   answers with 404 or one whose branch the Hub refuses to create, or a dry
   run leaves the bookkeeping as it was); then the files go out in batches
   of at most ``remote.max_files_per_add`` (one commit each on the Hub), a
   folder's metadata.json before its shards. After each batch the remote
   confirmed, its shards are recorded as ``pushed``.

Guarantees: a row is never lost (until the remote confirms a shard, its rows
stay unsent) and never sent twice (a crash after the commit and before the
bookkeeping leaves the shard pending; step 2 finds it on the remote next
time, and :meth:`~store.sync.remote.Remote.add_files` skips files that
exist, so a retried commit is a no-op). A push with nothing new makes no
commit and no branch.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from store.errors import JudgestoreError, RemoteError, RemoteMetadataError, SchemaBehindError
from store.interrupts import carrying
from store.layout import METADATA_FILE, Location, Selector, StoredMetadata, metadata_bytes
from store.repository import STREAM_SLICE
from store.settings import SyncSettings, from_environment
from store.store import Store
from store.sync.bookkeeping import Bookkeeping, NewShard, ShardState, bookkeeping_path
from store.sync.remote import MissingBranch, OutgoingFile, Remote, at_default, check_outside_store
from store.sync.remote_layout import (
    METADATA_MAX_BYTES,
    SHARDS_DIR,
    metadata_path,
    remote_folder,
    verify_remote_metadata,
)
from store.sync.shards import SHARD_SUFFIX, BuiltShard, ShardOrigin, ShardWriter, shard_file_name
from store.sync.workspace import (
    ProgressCallback,
    SyncProblem,
    no_progress,
    preview_root,
    staging_folder,
    sync_lock,
)
from store.tables.models import MODEL_OF_ROLE

KEY_BATCH = 10_000  # keys checked against the bookkeeping per statement


@dataclass(slots=True)
class PushedFolder:
    """What a push sent (or, in a dry run, would send) for one descriptor folder."""

    location: Location
    shards: int = 0
    rows: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**self.location.as_dict(), "shards": self.shards, "rows": self.rows, "bytes": self.bytes}


@dataclass(slots=True)
class PushReport:
    """The outcome of :func:`push`. ``ok`` is false when some folder could not be pushed."""

    remote: str
    dry_run: bool
    folders: list[PushedFolder] = field(default_factory=list)
    commits: list[str] = field(default_factory=list)
    unchanged: int = 0  # selected folders with nothing new for this remote
    already_present: int = 0  # shards the remote had already (another pusher, or an interrupted push)
    recovered: int = 0  # pending shards of an interrupted push, found on the remote and recorded
    problems: list[SyncProblem] = field(default_factory=list)
    created_branch: MissingBranch | None = None  # the branch did not exist and was made (a dry run: would be)
    created_repo: bool = False  # --create-repo made the repository or folder (a dry run: would make it)
    databases_selected: int = 0  # the databases the selection picked (0: a mistyped --task, not "all on the remote")
    # What the remote has confirmed so far and was recorded as pushed: all of it once the push returns, what it had
    # committed before a Ctrl-C (the report an interrupt carries: see push)
    shards_confirmed: int = 0
    rows_confirmed: int = 0

    @property
    def shards(self) -> int:
        return sum(f.shards for f in self.folders)

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.folders)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.folders)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "remote": self.remote,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "shards": self.shards,
            "rows": self.rows,
            "bytes": self.bytes,
            "commits": self.commits,
            "unchanged_folders": self.unchanged,
            "already_present": self.already_present,
            "recovered": self.recovered,
            "created_branch": None if self.created_branch is None else self.created_branch.as_dict(),
            "created_repo": self.created_repo,
            "databases_selected": self.databases_selected,
            "folders": [f.as_dict() for f in self.folders],
            "problems": [p.as_dict() for p in self.problems],
        }


@dataclass(slots=True)
class _FolderPlan:
    location: Location
    metadata: StoredMetadata
    shards: list[BuiltShard]
    metadata_file: Path | None = None  # set when the remote has no metadata.json for the folder yet


def push(
    store: Store,
    remote: Remote,
    selector: Selector | None = None,
    *,
    dry_run: bool = False,
    target_bytes: int | None = None,
    progress: ProgressCallback = no_progress,
) -> PushReport:
    """Push the selected folders' unsent rows to ``remote`` (see the module docstring).

    ``target_bytes``: the uncompressed bytes of a shard; None, the ``JUDGESTORE_SHARD_TARGET_BYTES`` setting
    (:class:`~store.settings.SyncSettings`), as the command line reads it.

    A ``KeyboardInterrupt`` (Ctrl-C) gets ``push_report``, the report so far: ``commits``, ``shards_confirmed``
    and ``rows_confirmed`` say what the remote confirmed before it. The batch it stopped in stays pending, and
    the next push settles it (step 2).
    """
    store.require_present("to push")  # a StoreMissingError naming the store, as every command that reads one
    if target_bytes is None:
        target_bytes = from_environment(SyncSettings).shard_target_bytes
    check_outside_store(remote, store.root)
    report = PushReport(remote.url, dry_run)
    with carrying("push_report", report):  # what the remote confirmed before a Ctrl-C, for the CLI
        missing = _reach(remote)
        return _push(store, remote, selector, report, target_bytes, progress, missing)


def _reach(remote: Remote) -> MissingBranch | None:
    """Ask the remote once before anything is exported or created here, as a fetch does: one that is not there
    (a folder never made, a repository the Hub answers with 404) or refuses us is said first. Returns the branch
    the push will make, if any (:meth:`Remote.missing_branch`)."""
    if not at_default(remote):
        return remote.missing_branch()
    remote.head()
    return None


def _push(
    store: Store,
    remote: Remote,
    selector: Selector | None,
    report: PushReport,
    target_bytes: int,
    progress: ProgressCallback,
    missing: MissingBranch | None,
) -> PushReport:
    """:func:`push` itself, filling ``report`` as it goes (so that an interrupt can tell what was done); ``missing``
    is :func:`_reach`'s."""
    dry_run = report.dry_run
    locations = store.select(selector)
    report.databases_selected = len(locations)
    with ExitStack() as stack:
        root = stack.enter_context(preview_root(store.root, dry_run))
        stack.enter_context(sync_lock(root))
        books = stack.enter_context(Bookkeeping(root, settings=store.settings))
        # Looked up, not recorded: the remote is recorded with the first shard sent to it, so a push that
        # fails (a repository the Hub answers with 404) or a dry run leaves the bookkeeping as it was.
        remote_id = books.find_remote(remote.pushed_to)
        if dry_run and remote_id is not None and books.shards(remote_id, ShardState.PENDING):
            books = stack.enter_context(_scratch_copy(root, store))  # the dry run settles them there, below
        staging = stack.enter_context(staging_folder(root))
        branch = not at_default(remote)
        repository = books.find_remote(remote.url) if branch else None
        known = [i for i in (remote_id, repository) if i is not None]
        # A branch is asked which shards it holds (one listing per folder): what the bookkeeping knows the
        # repository holds (pushed to its default branch, or fetched) may have reached main after the branch was
        # made from it. With nothing recorded there is nothing to check against.
        on_branch = remote if branch and known else None
        # On the default branch, what only shards fetched at another revision vouch for is asked of its listing.
        on_default = remote if not branch and known else None
        listed_on_default: dict[str, frozenset[str]] = {}
        # A branch still to make is read at the commit it will be made from: that is what it will hold.
        at = None if missing is None else missing.base
        if remote_id is not None:  # (a dry run's pending shards are settled in a copy of the bookkeeping)
            report.recovered = _settle_pending(books, remote_id, remote, at)

        def plan_all(on_branch: Remote | None, at: str | None, staging: Path) -> list[_FolderPlan]:
            report.problems, report.unchanged = [], 0
            plans: list[_FolderPlan] = []
            for done, location in enumerate(locations, start=1):
                try:
                    plan = _plan_folder(
                        store, location, books, known, staging, target_bytes, on_branch, at, on_default,
                        listed_on_default,
                    )  # fmt: skip
                except RemoteError:
                    raise  # the remote failed, not this folder: the push stops, with nothing recorded for it
                except SchemaBehindError as e:  # JUDGESTORE_AUTO_UPGRADE, which its message offers, needs a writer
                    reason = e.for_a_reader("push") if store.readonly else str(e)  # `hub push` opens it read-only
                    report.problems.append(SyncProblem(remote_folder(location), reason))
                    continue
                except JudgestoreError as e:
                    report.problems.append(SyncProblem(remote_folder(location), str(e)))
                    continue
                finally:
                    progress("Exporting", done, len(locations))
                if plan is None:
                    report.unchanged += 1
                else:
                    plans.append(plan)
            plans = _check_remote_metadata(plans, remote, staging, report, at)
            report.folders = [
                PushedFolder(p.location, len(p.shards), sum(s.rows for s in p.shards), sum(s.size for s in p.shards))
                for p in plans
            ]
            return plans

        plans = plan_all(on_branch, at, staging)
        if not dry_run and remote_id is not None:
            for folder, names in listed_on_default.items():  # the default branch showed them: no need to ask again
                books.mark_on_default(remote_id, folder, names)
        if plans:  # nothing to send makes no branch
            report.created_branch = missing
        if dry_run or not plans:
            return report
        # Before anything is recorded: a refused create (401, 403) leaves no trace.
        if missing is not None and not remote.create_branch(missing):
            # Another pusher made the branch meanwhile, from another commit (or has committed to it since): what
            # was planned against the pinned commit is not what it holds. Plan again against the branch itself.
            report.created_branch = None
            plans = plan_all(remote if known else None, None, staging / "again")
            if not plans:
                return report
        remote_id = books.remote_id(remote.pushed_to)  # the remote answered (metadata checked): record it now
        books.record(
            remote_id,
            ShardState.PENDING,
            (NewShard(remote_folder(p.location), s.name, s.rows, s.size, s.keys) for p in plans for s in p.shards),
        )
        _send(plans, remote, books, remote_id, report, progress)
    return report


@contextmanager
def _scratch_copy(root: Path, store: Store) -> Iterator[Bookkeeping]:
    """A throwaway copy of ``root``'s bookkeeping: a dry run after an interrupted push settles its pending shards
    there as the push will (asking the remote which it holds), so it says what the push will send; it counted
    every pending shard as unsent (218 shards where the push then sent 118: was)."""
    with tempfile.TemporaryDirectory(prefix="judgestore-preview-") as scratch:
        copied = bookkeeping_path(Path(scratch))
        copied.parent.mkdir(parents=True)
        with closing(sqlite3.connect(bookkeeping_path(root))) as source, closing(sqlite3.connect(copied)) as copy:
            source.backup(copy)
        with Bookkeeping(Path(scratch), settings=store.settings) as books:
            yield books


def _settle_pending(books: Bookkeeping, remote_id: int, remote: Remote, at: str | None = None) -> int:
    """Resolve shards an earlier push left pending; returns how many the remote turned out to have (at ``at``,
    the commit a missing branch will be made from, where one is)."""
    pending = books.shards(remote_id, ShardState.PENDING)
    if not pending:
        return 0
    paths = {
        (entry.folder, entry.name): f"{entry.folder}/{SHARDS_DIR}/{shard_file_name(entry.name)}" for entry in pending
    }
    present = remote.existing(list(paths.values()), revision=at)
    there = [shard for shard, path in paths.items() if path in present]
    books.set_state(remote_id, there, ShardState.PUSHED, on_default=at_default(remote))
    books.forget(remote_id, [shard for shard, path in paths.items() if path not in present])
    return len(there)


def _plan_folder(
    store: Store,
    location: Location,
    books: Bookkeeping,
    known: Sequence[int],
    staging: Path,
    target_bytes: int,
    branch: Remote | None = None,
    at: str | None = None,
    default: Remote | None = None,
    listed_on_default: dict[str, frozenset[str]] | None = None,
) -> _FolderPlan | None:
    """Shards of the folder's rows the remote (``known``: the bookkeeping's names of what it holds) does not have,
    or None if it has them all (or the folder none).

    With ``branch`` (a push to a branch that is not the repository's default), the shards the branch lists are
    asked for first and only those count: the bookkeeping knows what the repository holds (pushed to its default
    branch, fetched), not which of it the branch was made with or has received since. ``at`` is the commit a
    missing branch will be made from (its listing is read there), None for the branch head.

    With ``default`` (a push to the repository's default branch, once something was shared with it), a key counts
    as held only through a shard known to be on that branch; what only shards fetched at another revision hold is
    settled by one listing of the folder there (:func:`_not_on_default`), kept in ``listed_on_default``.
    """
    database = store.open_existing(location)
    if database is None:  # no tables yet: nothing to send
        return None
    folder = remote_folder(location)
    among = None if branch is None else _listed_shards(branch, location, at)
    on_default = default is not None
    unsent: list[str] = []
    batch: list[str] = []
    # Only keys are read while scanning; rows are read back by key once the unsent ones are known, a slice at a time
    # (store.repository.STREAM_SLICE: a hundred of the widest rows is tens of MB), however large the table is.
    keys = select(MODEL_OF_ROLE[location.role].__table__.c.input_hash)
    for (key,) in database.stream(keys, KEY_BATCH):
        batch.append(key)
        if len(batch) >= KEY_BATCH:
            unsent += books.unknown_keys(known, folder, batch, among=among, on_default=on_default)
            batch = []
    unsent += books.unknown_keys(known, folder, batch, among=among, on_default=on_default)
    if unsent and default is not None:
        unsent = _not_on_default(default, location, books, known, unsent, listed_on_default)
    if not unsent:
        return None
    unsent.sort()
    metadata = database.metadata()
    writer = ShardWriter(ShardOrigin.of(metadata), staging / folder, target_bytes)
    for start in range(0, len(unsent), STREAM_SLICE):
        chunk = unsent[start : start + STREAM_SLICE]
        found = database.get_many(chunk, deferred=False)
        for key in chunk:
            if key in found:  # deleted since the scan: nothing to send
                writer.add(found[key])
    shards = writer.close()
    return _FolderPlan(location, metadata, shards) if shards else None


def _not_on_default(
    remote: Remote,
    location: Location,
    books: Bookkeeping,
    known: Sequence[int],
    unsent: list[str],
    listed: dict[str, frozenset[str]] | None,
) -> list[str]:
    """Of ``unsent`` (keys that no shard known to be on the default branch holds), those the branch lacks.

    A key some other recorded shard holds (fetched at another branch, tag or commit, or by a bookkeeping that did
    not tell revisions apart) may be on the default branch all the same: its listing of the folder decides, as for
    a push to a branch. It is asked only then, once, and kept in ``listed`` (so the caller records those shards as
    on the branch, and the next push need not ask). The other keys are unsent whatever it lists.
    """
    folder = remote_folder(location)
    doubtful = set(unsent).difference(books.unknown_keys(known, folder, unsent))
    if not doubtful:
        return unsent
    names = _listed_shards(remote, location)
    if listed is not None:
        listed[folder] = names
    held = doubtful.difference(books.unknown_keys(known, folder, sorted(doubtful), among=names))
    return [key for key in unsent if key not in held]


def _listed_shards(remote: Remote, location: Location, at: str | None = None) -> frozenset[str]:
    """The names of the folder's shards the remote lists now (one listing; untrusted names are only ever compared
    with names the bookkeeping recorded, so a stray file there cannot make a row count as held)."""
    prefix = f"{remote_folder(location)}/{SHARDS_DIR}/"
    return frozenset(
        entry.path.removeprefix(prefix).removesuffix(SHARD_SUFFIX)
        for entry in remote.list(prefix.rstrip("/"), revision=at, recursive=False)
        if not entry.is_dir and entry.path.startswith(prefix) and entry.path.endswith(SHARD_SUFFIX)
    )


def _check_remote_metadata(
    plans: list[_FolderPlan], remote: Remote, staging: Path, report: PushReport, at: str | None = None
) -> list[_FolderPlan]:
    """Keep the folders whose remote metadata.json is ours byte for byte, or absent (then it is sent too)."""
    if not plans:
        return plans
    present = remote.existing([metadata_path(p.location) for p in plans], revision=at)
    kept: list[_FolderPlan] = []
    for plan in plans:
        ours = metadata_bytes(plan.metadata.role, plan.metadata.task, plan.metadata.descriptor,
                              plan.metadata.assumptions)  # fmt: skip
        path = metadata_path(plan.location)
        if path in present:
            theirs = remote.read(path, revision=at, max_bytes=METADATA_MAX_BYTES)
            try:
                verify_remote_metadata(theirs, plan.location)
                if theirs != ours:  # well-formed, but not ours (other assumptions, another version's format)
                    raise RemoteMetadataError(
                        path,
                        "is not byte-identical to this store's metadata.json for the folder (other assumptions, "
                        "or written by another judgestore version)",
                    )
            except RemoteMetadataError as e:
                report.problems.append(SyncProblem(path, f"{e.reason}; this folder was not pushed"))
                continue
        else:
            plan.metadata_file = staging / remote_folder(plan.location) / METADATA_FILE
            plan.metadata_file.parent.mkdir(parents=True, exist_ok=True)
            plan.metadata_file.write_bytes(ours)
        kept.append(plan)
    return kept


def _send(
    plans: list[_FolderPlan],
    remote: Remote,
    books: Bookkeeping,
    remote_id: int,
    report: PushReport,
    progress: ProgressCallback,
) -> None:
    """Add the files in batches; record each batch's shards as pushed as soon as the remote confirms it."""
    outgoing: list[tuple[OutgoingFile, str, str | None]] = []  # (file, folder, shard name or None)
    shard_rows: dict[tuple[str, str], int] = {}
    for plan in plans:
        folder = remote_folder(plan.location)
        if plan.metadata_file is not None:
            outgoing.append((OutgoingFile(metadata_path(plan.location), plan.metadata_file), folder, None))
        for shard in plan.shards:
            path = f"{folder}/{SHARDS_DIR}/{shard.file_name}"
            outgoing.append((OutgoingFile(path, shard.path), folder, shard.name))
            shard_rows[folder, shard.name] = shard.rows
    shard_count = sum(len(p.shards) for p in plans)
    rows = sum(s.rows for p in plans for s in p.shards)
    message = f"judgestore push: {shard_count} shards, {rows} rows in {len(plans)} folders"
    size = max(1, remote.max_files_per_add)
    on_default = at_default(remote)  # a push to another branch is recorded under its name, not as on the default
    sent = 0
    for start in range(0, len(outgoing), size):
        batch = outgoing[start : start + size]
        result = remote.add_files([file for file, _, _ in batch], message=message)
        present = set(result.present)
        confirmed = [(folder, name) for _, folder, name in batch if name is not None]
        report.already_present += sum(1 for file, _, name in batch if name is not None and file.path in present)
        revision = result.commits[-1] if result.commits else None
        books.set_state(remote_id, confirmed, ShardState.PUSHED, revision, on_default=on_default)
        report.commits += result.commits
        report.shards_confirmed += len(confirmed)
        report.rows_confirmed += sum(shard_rows[shard] for shard in confirmed)
        sent += len(batch)
        progress("Uploading", sent, len(outgoing))
