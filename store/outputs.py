"""Files a command writes whole: replaced on success, left as they were on failure.

Contract: :func:`replacing` writes a file beside its destination and renames
it into place, so a failed or interrupted write leaves no partial file and
the file it would replace unchanged; the new file gets the permissions the
file it replaces had, else those the umask gives a new file (as ``>`` would).
A link's target is replaced, not the link; a device or a pipe
(``/dev/stdout``, a FIFO) is written in place (:func:`written_in_place`). A
destination that cannot be written (a folder, a full disk, a folder that is
not there: none is made, as ``open`` makes none) is an
:class:`~store.errors.OutputWriteError` naming it and what was written.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from store.errors import OutputWriteError


def _file_mode(path: Path) -> int:
    """The permissions ``path`` gets: those of the file it replaces, else what the umask leaves of 0o666.

    (mkstemp creates its file 0o600 whatever the umask; a file written with
    ``>`` or ``cp`` would be readable as the umask says.)
    """
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0o022)  # reading the umask means setting it: put it straight back
        os.umask(umask)
        return 0o666 & ~umask


def written_in_place(path: Path) -> bool:
    """Whether writing ``path`` writes it in place: a device or a pipe (``/dev/stdout``, a FIFO), which
    an interrupted export leaves holding the rows written so far. A file (or a link to one, or nothing yet) is
    written beside it and renamed into place, so that an interrupted or failed export leaves it as it was."""
    try:
        mode = path.stat().st_mode  # through links, as opening it goes: /dev/stdout to a pipe has no path to resolve
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


@contextmanager
def replacing(path: Path, mode: str, what: str = "the export", after: str = "") -> Iterator[IO[Any]]:
    """A handle (``mode`` ``"w"`` or ``"wb"``) on ``path``'s new content (``what``: what is written, and
    ``after``, what the user should know then, as errors say them): see the module docstring.

    A temporary file beside the file (a link's target) replaces it on success and is removed on failure; a
    device or a pipe is written in place. An ``OSError`` of the body is the destination's: the store raises its
    own errors (:mod:`store.errors.files`), never a bare ``OSError``.
    """
    text: dict[str, Any] = {} if "b" in mode else {"encoding": "utf-8", "newline": ""}
    target = path.resolve()  # a link's target, which the link keeps pointing at
    try:
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, "it is a folder, not a file")
        if written_in_place(path):  # /dev/stdout, a FIFO: no rename over it, no seek in it
            with open(path, mode, **text) as handle:  # by its name: /dev/stdout to a pipe resolves to no path
                yield handle
            return
        if not target.parent.is_dir():  # made by no one but the user: a mistyped path must not grow folders
            folder = next(f for f in target.parents if f.exists())
            if not folder.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file, not a folder")
            raise FileNotFoundError(errno.ENOENT, f"there is no folder {target.parent}")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise OutputWriteError(path, what, e, after) from e
    try:
        with open(fd, mode, **text) as handle:
            yield handle
        os.chmod(tmp, _file_mode(target))
        os.replace(tmp, target)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        left = "the file it would replace is unchanged" if target.exists() else "no file was created"
        raise OutputWriteError(path, what, e, f"{left}; {after}" if after else left) from e
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, Exception):  # a failed read of the store: what it leaves of the file is worth saying too
            e.add_note(f"Nothing was written to {path}: " + ("it is as it was." if target.exists() else "not created."))
        raise
