"""Interrupts held back while work that cannot take them runs (``store.interrupts.deferred_interrupts``)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import closing
from pathlib import Path

import orjson
import pytest
import typer

from store.cli.common import command_errors
from store.interrupts import deferred_interrupts, interrupts_reach_the_command
from store.store import Store
from store.tables.filters import RowFilter
from tests.factories import QWEN, completion_record

UNTIL = "once the work is done"


def interrupt_self(signum: int = signal.SIGINT) -> None:
    os.kill(os.getpid(), signum)  # delivered to the main thread, whose handler runs before the next statement


def test_a_held_ctrl_c_stops_the_work_once_it_is_done(capsys: pytest.CaptureFixture[str]) -> None:
    handler = signal.getsignal(signal.SIGINT)
    finished = []
    with pytest.raises(KeyboardInterrupt), deferred_interrupts(UNTIL):
        interrupt_self()
        finished.append(True)  # the work went on to its end
    assert finished == [True]
    assert f"stopping {UNTIL} (press Ctrl-C again to stop at once)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is handler  # put back


def test_a_held_ctrl_c_is_not_lost_when_the_work_fails() -> None:
    """The whole process group got it, the work's child process died of it first, and the work failed: the
    failure was raised, the interrupt lost (the run said the engine failed, exit 1, not 'interrupted')."""
    with pytest.raises(KeyboardInterrupt) as caught, deferred_interrupts(UNTIL):
        interrupt_self()
        raise RuntimeError("the engine process died")
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_without_a_signal_the_work_and_its_failure_are_as_they_are() -> None:
    with pytest.raises(RuntimeError, match="failed"), deferred_interrupts(UNTIL):
        raise RuntimeError("failed")
    with deferred_interrupts(UNTIL):
        pass


def run(body: str) -> subprocess.CompletedProcess[str]:
    code = "import os, signal, time\nfrom store.interrupts import deferred_interrupts\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_second_signal_ends_the_process_at_once() -> None:
    result = run(
        """
        with deferred_interrupts("once the work is done"):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        print("went on")
        """
    )
    assert result.returncode == 128 + signal.SIGTERM and "stopped at once" in result.stderr
    assert result.stdout == ""


@command_errors
def _command_holding_a_signal(*, json_output: bool, signals: int) -> None:
    """A command whose work holds signals back (as vLLM's engine start does), interrupted ``signals`` times."""
    with deferred_interrupts(UNTIL):
        for _ in range(signals):
            interrupt_self()
        time.sleep(0.01 if signals == 1 else 30)


def test_with_json_a_held_ctrl_c_is_said_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`generate --json`, Ctrl-C as the engine started: a plain "stopping ..." line in stderr's JSON (was)."""
    with pytest.raises(typer.Exit) as ended:
        _command_holding_a_signal(json_output=True, signals=1)
    assert ended.value.exit_code == 130
    said = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert said == [
        {"warning": f"stopping {UNTIL} (press Ctrl-C again to stop at once)", "type": "HeldInterrupt"},
        {"error": "interrupted", "type": "Interrupted"},
    ]
    with pytest.raises(KeyboardInterrupt), deferred_interrupts(UNTIL):  # the plain line again after the command
        interrupt_self()
    assert capsys.readouterr().err == f"stopping {UNTIL} (press Ctrl-C again to stop at once)\n"


def test_with_json_a_second_signal_is_said_as_json_too() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from tests.store.test_interrupts import _command_holding_a_signal as c\n"
         "c(json_output=True, signals=2)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    assert [orjson.loads(line)["warning"] for line in result.stderr.splitlines()] == [
        f"stopping {UNTIL} (press Ctrl-C again to stop at once)",
        "stopped at once",
    ]


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie no one reaps has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_second_signal_ends_the_child_processes_started_a_moment_before() -> None:
    """vLLM's engine process, forked as the signals came: multiprocessing lists a child once its start returns, so
    the one being started ran on, holding the run's stderr for minutes (was). Its own child processes end too;
    one there before (a host program's own) is left."""
    result = run(
        """
        if (host := os.fork()) == 0:
            os.close(1), os.close(2)
            time.sleep(30)
            os._exit(0)
        with deferred_interrupts("once the work is done"):
            started, said = os.pipe()
            if (child := os.fork()) == 0:  # an engine process being started, that starts one of its own
                if (grandchild := os.fork()) != 0:
                    os.write(said, grandchild.to_bytes(4, "big"))
                os.close(1), os.close(2)  # the run's output is not held open by them
                time.sleep(30)
                os._exit(0)
            grandchild = int.from_bytes(os.read(started, 4), "big")  # once it is started
            os.write(1, f"{child} {grandchild} {host}".encode())
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        """
    )
    said = [int(pid) for pid in result.stdout.split()]
    try:
        assert result.returncode == 128 + signal.SIGTERM and "stopped at once" in result.stderr, result.stderr
        assert len(said) == 3 and all(pid > 0 for pid in said), said
        *pids, host = said
        deadline = time.monotonic() + 10  # a killed process ends a moment after the kill returns
        while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(pid) for pid in pids)
        assert _running(host)
    finally:
        for pid in said:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_signal_the_process_ignores_stays_ignored() -> None:
    """`judgestore generate &` in a script: SIGINT ignored; a Ctrl-C said 'stopping', a second one ended it (was)."""
    result = run(
        """
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with deferred_interrupts("once the work is done"):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        print("went on", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
        """
    )
    assert result.returncode == 0 and result.stdout == "went on True\n" and result.stderr == ""


def test_ctrl_c_in_a_finalizer_still_stops_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python drops a KeyboardInterrupt raised in a finalizer ("Exception ignored in: ..."): an import that Ctrl-C
    reached while the garbage collector ran one went on to the end and exited 0 (was)."""

    class Finalized:
        def __del__(self) -> None:
            raise KeyboardInterrupt  # where Ctrl-C landed

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # put back after the test
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        interrupts_reach_the_command()
        Finalized()  # dropped at once: its finalizer runs here
        threading.Event().wait(30)
    assert time.monotonic() - started < 20  # the wait ended, as at Ctrl-C (it ran its 30 s, then the interrupt came)


def test_other_errors_in_finalizers_are_reported_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_type))
    interrupts_reach_the_command()

    class Failing:
        def __del__(self) -> None:
            raise ValueError("in a finalizer")

    Failing()
    assert seen == [ValueError]


class Deadline(Exception):
    """What a deadline's signal handler raises (pytest-timeout's, a job's SIGALRM)."""


def _time_is_up(signum: int, frame: object) -> None:
    raise Deadline("time is up")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGALRM], ids=["ctrl-c", "deadline"])
def test_a_signal_stops_a_long_delete_at_once_with_its_own_exception_and_deletes_nothing(
    tmp_path: Path, signum: int
) -> None:
    """Python runs a signal's handler only between bytecodes: a DELETE of 400,000 rows heard Ctrl-C 6.5 s later,
    once SQLite had done it (then rolled back) (was); and then every signal's exception came back as a
    KeyboardInterrupt. A trigger makes each row's delete take a second or more here."""
    expected: type[BaseException] = Deadline if signum == signal.SIGALRM else KeyboardInterrupt
    with Store(root=tmp_path) as store:
        database = store.database("completions", "t", QWEN)
        database.put_many([completion_record(i) for i in range(800)])
    with closing(sqlite3.connect(database.path)) as conn, conn:  # 800^3 rows counted for each row deleted
        conn.execute("CREATE TRIGGER slow BEFORE DELETE ON completions BEGIN "
                     "SELECT count(*) FROM completions a, completions b, completions c; END")  # fmt: skip
    with Store(root=tmp_path) as store:
        database = store.database("completions", "t", QWEN)
        previous = signal.signal(signal.SIGALRM, _time_is_up)
        sender = threading.Timer(0.5, os.kill, (os.getpid(), signum))
        sender.start()
        started = time.monotonic()
        try:
            with pytest.raises(expected):
                database.delete(RowFilter(benchmark="mt-bench"))
        finally:
            sender.cancel()  # a delete that failed at once leaves no signal to land in the next test
            signal.signal(signal.SIGALRM, previous)
        stopped = time.monotonic() - started
        assert database.count() == 800  # its transaction rolled back
        assert database.put_many([completion_record(800)]) == 1  # the connection is fit for the next statement
    assert stopped < 60  # uninterrupted: some 20 minutes here (800 rows, 1.5 s each; 400 rows took 92 s)


def test_ctrl_c_stops_a_long_delete_while_another_thread_deletes_and_the_hook_is_put_back(tmp_path: Path) -> None:
    """A delete in another thread that ended first turned sqlite3's callback tracebacks off under the long one:
    Ctrl-C then came out as "SQLite failed: interrupted ... restore it from a backup" (was); and the thread that
    ended last put back the other's hook, so the process kept a stale one (was)."""
    with Store(root=tmp_path) as store:
        slow = store.database("completions", "t", QWEN)
        slow.put_many([completion_record(i) for i in range(800)])
        quick = store.database("completions", "u", QWEN)
        quick.put_many([completion_record(i) for i in range(10)])
    with closing(sqlite3.connect(slow.path)) as conn, conn:
        conn.execute("CREATE TRIGGER slow BEFORE DELETE ON completions BEGIN "
                     "SELECT count(*) FROM completions a, completions b, completions c; END")  # fmt: skip
    hook = sys.unraisablehook
    with Store(root=tmp_path) as store:
        slow, quick = store.database("completions", "t", QWEN), store.database("completions", "u", QWEN)
        other = threading.Thread(target=quick.delete, args=(RowFilter(benchmark="mt-bench"),))
        ctrl_c = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        threading.Timer(0.3, other.start).start()
        ctrl_c.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                slow.delete(RowFilter(benchmark="mt-bench"))
        finally:
            ctrl_c.cancel()
            time.sleep(0.4)
            other.join(timeout=30)
        assert slow.count() == 800 and quick.count() == 0
    assert sys.unraisablehook is hook
