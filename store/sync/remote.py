"""Remotes: where shards are shared. The :class:`Remote` protocol and the plain-folder remote.

Contract of every remote (the contract tests in ``tests/sync`` run against
each implementation):

* Files are immutable once written. :meth:`Remote.add_files` writes only the
  paths that are absent and reports the rest as already present; it never
  rewrites a file. Shard paths are content addressed, so "present" means
  "the same rows are there".
* :meth:`Remote.head` pins a revision (a commit id, or None where the remote
  has no history); :meth:`Remote.list` and :meth:`Remote.read` at that
  revision see one consistent state even while others push.
* :meth:`Remote.list` of a prefix that does not exist is empty; paths in the
  answer are relative to the remote's root, ``/``-separated, and untrusted
  (the caller parses them with :func:`store.sync.remote_layout.parse_remote_path`).
* :meth:`Remote.read` never returns more than ``max_bytes``.
* :meth:`Remote.missing_branch` says whether the branch a push goes to is
  still to be made, and from which commit; :meth:`Remote.create_branch` makes
  it from that commit. Until then a push reads, at that commit, what the
  branch will hold; if another pusher made the branch meanwhile elsewhere,
  the push reads the branch again. A remote without branches (a folder) has
  none missing.
* Errors are :class:`~store.errors.RemoteError` (the remote failed) or
  :class:`~store.errors.UntrustedContentError` (a file is not what it
  should be), never a bare ``OSError`` or HTTP exception.

:class:`DirectoryRemote` is a folder, e.g. on a cluster's shared filesystem.
Each file is written to a temporary name beside its target, fsynced, then
hard-linked into place, which fails if the target exists: concurrent writers
never see half a file and never overwrite one. It keeps no history, so its
head is None and a fetch simply sees the files present when it lists them.
Its listings leave out dot-named *files* (its own temporary files, and the
``.nfs*`` or ``.DS_Store`` files a shared filesystem leaves), which the
layout never names; dot-named *folders* are listed, since a task or a model
may start with ``.`` (``.%2Fmodels%2Fx``): every folder a push wrote is seen.
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from store.descriptor import is_text
from store.errors import InvalidInputError, RemoteError, RemoteNotFoundError, UntrustedContentError
from store.sync.remote_layout import safe_segments


@dataclass(frozen=True, slots=True)
class RemoteEntry:
    """One file or folder in a listing (``size`` in bytes, None for folders or when unknown)."""

    path: str
    is_dir: bool
    size: int | None = None


@dataclass(frozen=True, slots=True)
class OutgoingFile:
    """A file to write: its path on the remote and the local file holding its bytes."""

    path: str
    source: Path


@dataclass(frozen=True, slots=True)
class AddResult:
    """What :meth:`Remote.add_files` did: paths it wrote, paths already there, commits it made."""

    added: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    commits: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class MissingBranch:
    """A branch a push goes to that does not exist yet: its name and the commit it is to be made from."""

    name: str
    base: str  # the repository's default branch head when the branch was found missing

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "from_commit": self.base}


@runtime_checkable
class Remote(Protocol):
    """Where shards are shared (see the module docstring for the contract)."""

    @property
    def url(self) -> str:
        """A stable name for this remote, under which the bookkeeping records what was shared with it."""
        ...

    @property
    def pushed_to(self) -> str:
        """The name under which the bookkeeping records what a push sent: :attr:`url`, with the branch when a
        push goes to one that is not the default (shards sent there are not on the default branch)."""
        ...

    @property
    def max_files_per_add(self) -> int:
        """The most files one :meth:`add_files` call should carry (one commit on the Hub)."""
        ...

    def head(self) -> str | None: ...

    def list(self, prefix: str, *, revision: str | None, recursive: bool) -> list[RemoteEntry]: ...

    def read(self, path: str, *, revision: str | None, max_bytes: int) -> bytes: ...

    def existing(self, paths: Sequence[str], *, revision: str | None = None) -> set[str]: ...

    def add_files(self, files: Sequence[OutgoingFile], *, message: str) -> AddResult: ...

    def missing_branch(self) -> MissingBranch | None:
        """None when the branch a push goes to exists (always, where the remote has no branches); else the branch
        and the commit it would be made from, at which :meth:`list`, :meth:`read` and :meth:`existing` see what
        it will hold."""
        ...

    def create_branch(self, branch: MissingBranch) -> bool:
        """Make ``branch`` at its base commit. True when the branch now stands there (made by this call, or by an
        earlier attempt of it whose answer was lost); False when another pusher made it meanwhile and it stands
        elsewhere (made from another commit, or committed to since), so it need not hold what was read at the base
        commit. An existing branch is left as it is."""
        ...


class NotYetCreated:
    """The empty remote ``--create-repo`` would create, for a dry run to plan against; it is never written.

    It answers under the name of the remote it stands for (``url``, ``pushed_to``), so what the bookkeeping
    recorded under that name still counts, as it would once the remote is made.
    """

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    def __repr__(self) -> str:
        return f"NotYetCreated({self.remote!r})"

    @property
    def url(self) -> str:
        return self.remote.url

    @property
    def pushed_to(self) -> str:
        return self.remote.pushed_to

    @property
    def max_files_per_add(self) -> int:
        return self.remote.max_files_per_add

    def head(self) -> str | None:
        return None

    def list(self, prefix: str, *, revision: str | None = None, recursive: bool = False) -> builtins.list[RemoteEntry]:
        return []

    def read(self, path: str, *, revision: str | None = None, max_bytes: int) -> bytes:
        raise RemoteNotFoundError(self.url, f"{path} does not exist (the remote is not created yet)")

    def existing(self, paths: Sequence[str], *, revision: str | None = None) -> set[str]:
        return set()

    def add_files(self, files: Sequence[OutgoingFile], *, message: str = "") -> AddResult:
        raise RemoteError(self.url, "the remote is not created yet: only a dry run plans against it")

    def missing_branch(self) -> MissingBranch | None:
        return None  # the branch is made with the repository

    def create_branch(self, branch: MissingBranch) -> bool:
        raise RemoteError(self.url, "the remote is not created yet: only a dry run plans against it")


def at_default(remote: Remote) -> bool:
    """Whether ``remote`` reads and writes its repository's default branch (always, for a folder): what a fetch
    from it takes and a push to it confirms is on that branch, which the bookkeeping records (``on_default``). A
    remote at another branch, a tag or a commit is not: its :attr:`Remote.pushed_to` names that revision."""
    return remote.pushed_to == remote.url


def check_outside_store(remote: Remote, store_root: Path) -> None:
    """Refuse a folder remote that is the store's root or lies inside it: a push would write its shards among the
    store's descriptor folders (where ``verify`` finds them as strays) and a fetch would read the store as a remote."""
    if not isinstance(remote, DirectoryRemote):
        return
    inside, root = Path(os.path.realpath(remote.root)), Path(os.path.realpath(store_root))
    if inside.is_relative_to(root):
        raise InvalidInputError(
            f"the shared folder {remote.root} is inside the store {store_root}: give a folder outside the store"
        )


class DirectoryRemote:
    """A remote that is a plain folder (a shared filesystem, a USB disk, a test)."""

    max_files_per_add = 1000

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()
        # The bookkeeping records the remote by its url: one folder is one remote however it is reached (a link,
        # "..": a second name made fetched rows look unsent, and pushed them back), so the url is its real path,
        # unless that is not valid UTF-8 (the bookkeeping stores text) and the path given, a link to it, is.
        real = Path(os.path.realpath(self.root))
        self._named = real if is_text(str(real)) else self.root
        if not is_text(str(self._named)):
            raise InvalidInputError(
                f"dir:{self.root}: the shared folder's path is not valid UTF-8 text; rename it, or give a link to "
                "it whose path is"
            )
        if self.root.exists() and not self.root.is_dir():  # before --create-repo's mkdir, and any listing
            raise InvalidInputError(f"{self.url}: this is a file, not a folder; give the shared folder's path")

    def __repr__(self) -> str:
        return f"DirectoryRemote({str(self.root)!r})"

    @property
    def url(self) -> str:
        return f"dir:{self._named}"

    @property
    def pushed_to(self) -> str:
        return self.url  # a folder has no branches

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise RemoteNotFoundError(self.url, "the folder does not exist (create it, or check the path)")

    def _path(self, relative: str) -> Path:
        """The local path of a remote path, refusing anything that resolves outside the root (symlinks included)."""
        path = self.root.joinpath(*safe_segments(relative)) if relative else self.root
        real_root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise UntrustedContentError(relative, f"resolves outside {self.root} (a symbolic link?); refusing it")
        return path

    def head(self) -> str | None:
        self._check_root()
        return None

    def list(self, prefix: str, *, revision: str | None = None, recursive: bool = False) -> list[RemoteEntry]:
        self._check_root()
        base = self._path(prefix)
        if not base.is_dir():
            return []
        entries: builtins.list[RemoteEntry] = []
        self._scan(base, prefix, recursive, entries)
        return entries

    def _scan(self, folder: Path, relative: str, recursive: bool, out: builtins.list[RemoteEntry]) -> None:
        try:
            children = sorted(os.scandir(folder), key=lambda e: e.name)
        except FileNotFoundError:  # removed while listing
            return
        except OSError as e:
            raise RemoteError(self.url, f"cannot list {relative or '/'}: {e}") from e
        for child in children:
            # Symbolic links are not something a push writes, and following one could leave the root.
            if child.is_symlink():
                continue
            path = f"{relative}/{child.name}" if relative else child.name
            if child.is_dir(follow_symlinks=False):
                out.append(RemoteEntry(path, True))  # dot-named too: a task or model may start with "."
                if recursive:
                    self._scan(Path(child.path), path, recursive, out)
            elif child.is_file(follow_symlinks=False) and not child.name.startswith("."):
                out.append(RemoteEntry(path, False, child.stat(follow_symlinks=False).st_size))

    def read(self, path: str, *, revision: str | None = None, max_bytes: int) -> bytes:
        self._check_root()
        local = self._path(path)
        try:
            fd = os.open(local, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError as e:
            raise RemoteNotFoundError(self.url, f"{path} does not exist (removed since it was listed?)") from e
        except OSError as e:
            raise RemoteError(self.url, f"cannot read {path}: {e}") from e
        with os.fdopen(fd, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise UntrustedContentError(path, f"is larger than the cap of {max_bytes:,} bytes; refusing it")
        return data

    def existing(self, paths: Sequence[str], *, revision: str | None = None) -> set[str]:
        self._check_root()
        return {p for p in paths if self._path(p).is_file()}

    def missing_branch(self) -> MissingBranch | None:
        return None  # a folder has no branches

    def create_branch(self, branch: MissingBranch) -> bool:
        raise InvalidInputError(f"{self.url} is a folder: it has no branches, so {branch.name!r} cannot be made")

    def add_files(self, files: Sequence[OutgoingFile], *, message: str = "") -> AddResult:
        self._check_root()
        added: list[str] = []
        present: list[str] = []
        for file in files:
            (added if self._add(file) else present).append(file.path)
        return AddResult(tuple(added), tuple(present))

    def _add(self, file: OutgoingFile) -> bool:
        """Write one file unless it exists; True if this call wrote it."""
        target = self._path(file.path)
        if target.exists():
            return False
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
            try:
                with open(file.source, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())
                wrote = _link_no_replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_folder(target.parent)
        except OSError as e:
            raise RemoteError(self.url, f"cannot write {file.path}: {e}") from e
        return wrote


def _link_no_replace(tmp: Path, target: Path) -> bool:
    """Put ``tmp`` at ``target`` unless something is there already; True if it was put there."""
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        return False
    except OSError as e:
        # Some filesystems have no hard links. A rename then does the job; at worst two writers
        # rename the same content-addressed bytes over each other, which readers cannot tell apart.
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
            raise
        if target.exists():
            return False
        os.replace(tmp, target)
        return True


def _fsync_folder(folder: Path) -> None:
    """Make a new directory entry durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
