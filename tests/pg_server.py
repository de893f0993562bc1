"""A throwaway PostgreSQL cluster for the tests: ``initdb`` and ``pg_ctl`` on a Unix socket in a temporary folder.

The server binaries come from Debian's ``postgresql`` package (``.ci/setup``
installs it), which keeps them off PATH in ``/usr/lib/postgresql/<v>/bin``.
``initdb`` refuses to run as root, so as root the cluster is owned by and run
as the ``postgres`` system user (``runuser``). The socket is the only way in:
``listen_addresses`` is empty. The ``postgres`` superuser connects without a
password; every other role needs its SCRAM password (so a wrong password is
refused, as on a real server). Durability is off (``fsync=off``): these are
tests, and a crash loses nothing anyone needs.

The cluster lives in memory (``/dev/shm``) where there is room for it: each
test's database is a copy of ``template1`` (7.5 MB, written twice with its
WAL), which on this machine's disk cost 50-300 ms a database and, after
300 of them, 13 s to delete at the end of the run; in memory, 33 ms and
under a second. Each test's database is dropped when the test ends
(:meth:`Cluster.drop_database`), so the cluster stays small either way.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SUPERUSER = "postgres"
MEMORY_FOLDER = Path("/dev/shm")
MEMORY_NEEDED = 2 << 30  # free bytes in MEMORY_FOLDER for the cluster to live there (a container's is often 64 MB)


def server_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or None when the server is not installed."""
    found = shutil.which("pg_ctl")
    if found is not None:
        return Path(os.path.realpath(found)).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    return versions[-1].parent if versions else None


def _owner_command(argv: list[str]) -> list[str]:
    """``argv`` as the cluster's owner: the ``postgres`` user when we are root."""
    return ["runuser", "-u", SUPERUSER, "--", *argv] if os.geteuid() == 0 else argv


class Cluster:
    """One running cluster; :meth:`new_database` gives each test an empty database of its own."""

    def __init__(self, folder: Path, bin_dir: Path) -> None:
        self.folder, self.bin_dir = folder, bin_dir
        self.data = folder / "data"
        self._names = itertools.count(1)

    @property
    def socket_dir(self) -> str:
        return str(self.folder)

    def url(self, database: str = "postgres", user: str = SUPERUSER, password: str | None = None) -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql+psycopg://{auth}@/{database}?host={self.socket_dir}"

    def _run(self, *argv: str) -> None:
        subprocess.run(_owner_command([str(self.bin_dir / argv[0]), *argv[1:]]), check=True, capture_output=True)

    def start(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "-E", "UTF8", "--no-sync", "-A", "trust")
        (self.data / "pg_hba.conf").write_text(f"local all {SUPERUSER} trust\nlocal all all scram-sha-256\n")
        self._launch()

    def _launch(self) -> None:
        # A small WAL: it holds a copy of each new database until the next checkpoint, in memory if the cluster is.
        options = (
            f"-c listen_addresses='' -k {self.socket_dir} -c fsync=off -c max_connections=200"
            " -c max_wal_size=256MB -c min_wal_size=32MB"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-w", "-t", "60", "-l", str(self.folder / "log"), "start"
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def start_again(self) -> None:
        """Start the stopped server on the files in :attr:`data` (as they were left, or put back by a test)."""
        self._launch()

    def restart(self, downtime: float = 0.0) -> None:
        """Stop the server as a crash would (every connection dropped), wait ``downtime`` seconds, start it again."""
        self.stop()
        time.sleep(downtime)
        self._launch()

    def sql(self, statement: str, database: str = "postgres") -> list[tuple[object, ...]]:
        """Run one statement as the superuser (autocommit); return its rows, if any."""
        import psycopg

        with psycopg.connect(host=self.socket_dir, user=SUPERUSER, dbname=database, autocommit=True) as conn:
            cursor = conn.execute(statement)  # type: ignore[arg-type]
            return cursor.fetchall() if cursor.description else []

    def new_database(self) -> str:
        name = f"judgestore_{next(self._names)}"
        self.sql(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        """Drop ``name``, ending the connections a test left open to it."""
        self.sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _cluster_parent() -> str | None:
    """Where the cluster's folder goes: memory when it has room, else the system's temporary folder."""
    try:
        if shutil.disk_usage(MEMORY_FOLDER).free >= MEMORY_NEEDED:
            return str(MEMORY_FOLDER)
    except OSError:  # no /dev/shm on this system
        pass
    return None


@contextmanager
def running_cluster() -> Iterator[Cluster]:
    bin_dir = server_bin()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    folder = Path(tempfile.mkdtemp(prefix="judgestore-pg-", dir=_cluster_parent()))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SUPERUSER)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    cluster = Cluster(folder, bin_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
