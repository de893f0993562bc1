"""The journal a read-write open uses: WAL on local disks, the rollback journal on network filesystems.

Contract:

* :func:`journal_mode_for` chooses from :class:`~store.settings.Settings`
  ``journal_policy``: WAL on local disks; on a network filesystem (NFS,
  Lustre, GPFS, CIFS...: read from the mount table) the rollback journal with
  a :class:`NetworkFilesystemWarning`, or a refusal
  (:class:`~store.errors.NetworkFilesystemError`). Never silently.
* :class:`Filesystems` reads the mount table once (a store reads it when it
  opens its first database, not once per database); an unreadable table
  means "unknown", which is treated as a local disk.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from store.caller import warn_the_caller
from store.errors import NetworkFilesystemError
from store.settings import Settings

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "fuse.ceph",
        "glusterfs", "fuse.glusterfs", "fuse.sshfs", "beegfs", "9p", "afs", "panfs", "wekafs",
    }
)  # fmt: skip


MOUNTS_FILE = Path("/proc/self/mounts")


class NetworkFilesystemWarning(UserWarning):
    """The database is on a network filesystem: WAL is unsafe there, so the rollback journal is used."""


def _unescape_mount_path(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal (\040...); every
    # other character, non-ASCII ones included, is written as is.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: Path, mounts_file: Path | None = None) -> str | None:
    """Type of the filesystem holding ``path`` (its nearest existing ancestor), or None if unknown."""
    return Filesystems(mounts_file).type_of(path.resolve())


class Filesystems:
    """The filesystem types of paths, from one reading of the mount table.

    A store reads the table once, when it opens its first database, not once
    per database (mounts under a store root do not come and go while it is
    open). None when the table cannot be read.
    """

    def __init__(self, mounts_file: Path | None = None) -> None:
        try:
            text = (mounts_file or MOUNTS_FILE).read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            self._table: dict[str, str] | None = None
        else:
            self._table = _mount_table(text)

    def type_of(self, resolved: Path) -> str | None:
        """:func:`filesystem_type` of a path already resolved (strings, not Paths: it runs on every open)."""
        if self._table is None:
            return None
        target = str(resolved)
        while not os.path.exists(target) and target != (parent := os.path.dirname(target)):
            target = parent
        while True:  # deepest first: the innermost mount holding the path
            if target in self._table:
                return self._table[target]
            parent = os.path.dirname(target)
            if parent == target:
                return None
            target = parent


@functools.lru_cache(maxsize=8)
def _mount_table(text: str) -> dict[str, str]:
    """Mount point -> filesystem type of a mounts file's text; the last line for a mount point wins (parsed once)."""
    table: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            table[str(Path(_unescape_mount_path(fields[1])))] = fields[2]
    return table


def journal_mode_for(
    path: Path,
    settings: Settings,
    mounts_file: Path | None = None,
    *,
    resolved: Path | None = None,
    filesystems: Filesystems | None = None,
) -> str:
    """``"wal"`` or ``"delete"`` for a read-write open of ``path``, per the journal policy.

    ``resolved`` (its ``resolve()``) and ``filesystems`` (a reading of the
    mount table) are used when the caller has them.
    """
    policy = settings.journal_policy
    if policy == "wal":
        return "wal"
    if policy == "rollback":
        return "delete"
    fstype = (filesystems or Filesystems(mounts_file)).type_of(resolved or path.resolve())
    if fstype not in NETWORK_FILESYSTEMS:
        return "wal"
    if policy == "refuse-network":
        raise NetworkFilesystemError(
            path,
            f"lies on a {fstype} network filesystem and JUDGESTORE_JOURNAL_POLICY=refuse-network. "
            "Move the store to a local disk, or set JUDGESTORE_JOURNAL_POLICY=auto to use "
            "the rollback journal there.",
        )
    warn_the_caller(
        f"{path} lies on a {fstype} network filesystem: WAL needs shared memory that such "
        "filesystems do not provide, so the rollback journal is used (slower writes). "
        "Set JUDGESTORE_JOURNAL_POLICY=refuse-network to refuse instead.",
        NetworkFilesystemWarning,
    )
    return "delete"
