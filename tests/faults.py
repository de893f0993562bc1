"""Helpers of the fault tests: the whole CLI as a user runs it, small filesystems that fill up or turn
read-only, and damaged files.

A full disk and a read-only mount are real ones: a tmpfs mounted for the test (root, or CAP_SYS_ADMIN,
is needed; without it those tests are skipped and say why). As root, file permissions do not stop
reads or writes, so a read-only mount stands in for them.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from inference.cli.app import app


def judgestore(*args: str, input: str | None = None) -> Result:
    """The whole ``judgestore`` app (every command the console script has) in-process."""
    return CliRunner().invoke(app(), list(args), input=input, env={"COLUMNS": "200"})


def assert_failed_cleanly(result: Result, exit_code: int = 1) -> None:
    """The command exited with ``exit_code`` through the CLI's edge: no exception escaped, no traceback printed."""
    assert result.exit_code == exit_code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def assert_no_traceback(result: Result) -> None:
    """Whatever the exit status, no exception escaped the command and no traceback was printed."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def json_error(result: Result) -> dict[str, Any]:
    """The JSON error object a ``--json`` command printed on stderr."""
    error: dict[str, Any] = orjson.loads(result.stderr.strip().splitlines()[-1])
    return error


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextmanager
def small_filesystem(folder: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` for the block; skips the test where mounting is not permitted."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    if mounted.returncode != 0:
        pytest.skip(f"a real full or read-only filesystem needs `mount` (root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)


def remount(folder: Path, mode: str) -> None:
    """Remount the tmpfs on ``folder`` ``ro`` or ``rw``."""
    result = _mount("-o", f"remount,{mode}", str(folder))
    assert result.returncode == 0, result.stderr


def fill_up(folder: Path) -> Path:
    """Fill the filesystem holding ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


def damage_text(db_path: Path, role: str = "completions") -> str:
    """Make one row's input_text invalid UTF-8, as a damaged page leaves it; returns that row's key."""
    with closing(sqlite3.connect(db_path)) as conn, conn:
        (key,) = conn.execute(f"SELECT input_hash FROM {role} ORDER BY rowid LIMIT 1").fetchone()
        conn.execute(f"UPDATE {role} SET input_text = CAST(X'80FF' AS TEXT) WHERE input_hash = ?", (key,))
    return str(key)


def damage_page(db_path: Path, table: str = "completions") -> None:
    """Overwrite the root page of ``table`` with garbage: the header still opens, reading the rows fails."""
    with closing(sqlite3.connect(db_path)) as conn:
        (root_page,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db_path.read_bytes())
    data[(root_page - 1) * page_size : root_page * page_size] = b"\xff" * page_size
    db_path.write_bytes(bytes(data))


def is_root() -> bool:
    return os.geteuid() == 0


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` immutable for the block (``chattr +i``): nobody may write it, root included, while its folder may
    be written; skips the test where the filesystem or the user cannot set the flag."""
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"an immutable file needs `chattr` (root, a filesystem that has the flag): {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@contextmanager
def lock_held_elsewhere(lock_file: Path) -> Iterator[None]:
    """``lock_file`` (a :class:`filelock.FileLock`) held by another process for the block, as an upgrade or a
    vacuum running elsewhere holds it."""
    script = "import filelock, sys; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); "
    holder = subprocess.Popen(
        [sys.executable, "-c", script + "sys.stdin.read()", str(lock_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.communicate("")


NOBODY = 65534


@contextmanager
def as_nobody() -> Iterator[None]:
    """Run the block with the effective uid and gid of ``nobody`` (as root, file modes do not stop reads or
    writes); its files must be in folders anyone may enter (not under pytest's 0700 ones)."""
    try:
        os.setegid(NOBODY)
        os.seteuid(NOBODY)
    except OSError as e:
        pytest.skip(f"cannot take another user's uid to make a file unreadable to root: {e}")
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
