"""`judgestore browse` as a process: it serves where it says, on loopback unless told, and says what else exposes."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from store.cli import browse as browse_cli
from store.cli.app import build_app

REPO = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"browse: .* \(read-only\) at (http://\S+/) \(Ctrl-C stops\)")


@contextmanager
def browse(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``python -m store browse ARGS`` running; gives the process, the URL it printed and its stderr lines so far."""
    command = [sys.executable, "-m", "store", "browse", *args]
    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=environment)
    lines: list[str] = []
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                raise AssertionError(f"browse exited {process.wait()}: {''.join(lines)}")
            lines.append(line)
            found = SERVING.search(line)
            if found:
                yield process, found.group(1), lines
                break
        else:
            raise AssertionError(f"browse printed no URL: {''.join(lines)}")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def fetch(url: str, host: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:  # the socket listens before the URL is printed: no retry needed
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_browse_serves_on_loopback_on_a_free_port_and_stops_on_ctrl_c(demo_folder: Path) -> None:
    with browse("--store-root", str(demo_folder), "--port", "0") as (process, url, lines):
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/")
        assert str(demo_folder) in lines[-1]
        status, html = fetch(url)
        assert status == 200 and "<title>Overview · judgestore browse</title>" in html
        assert fetch(url, host="attacker.example")[0] == 403  # a page elsewhere cannot reach it through DNS
        assert not any("not a loopback address" in line for line in lines)
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 130  # stopped by Ctrl-C, as every command reports it
        assert process.stderr is not None and "Traceback" not in process.stderr.read()


def test_browse_on_every_address_says_what_that_exposes_first(demo_folder: Path) -> None:
    with browse("--store-root", str(demo_folder), "--host", "0.0.0.0", "--port", "0") as (_, url, lines):
        warning = "".join(lines[:-1])
        assert "0.0.0.0 is not a loopback address" in warning
        assert "can read every prompt, completion, verdict and descriptor in" in warning
        assert "any web page opened in a browser on a machine that can" in warning  # a DNS rebinding reaches it
        assert str(demo_folder) in warning and "no login and no TLS" in warning
        port = url.rsplit(":", 1)[1].rstrip("/")
        assert f"on port {port}," in " ".join(warning.split())  # the port bound, not the 0 given (was)
        assert fetch(f"http://127.0.0.1:{port}/", host="lan-host.example")[0] == 200  # other names are answered


def test_browse_opens_the_default_browser_when_asked(demo_folder: Path, tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    opener = tmp_path / "open-browser"
    opener.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    opener.chmod(0o755)
    with browse("--store-root", str(demo_folder), "--port", "0", "--open", env={"BROWSER": str(opener)}) as (
        _,
        url,
        _,
    ):
        for _ in range(100):
            if opened.exists() and opened.read_text().strip():
                break
            time.sleep(0.1)
        assert opened.read_text().strip() == url


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "store", "browse", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)  # fmt: skip


def test_browse_refuses_a_store_folder_that_does_not_exist(tmp_path: Path) -> None:
    result = run("--store-root", str(tmp_path / "nowhere"), "--port", "0")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "the folder does not exist: there is no store to browse; check --store-root" in result.stderr
    assert "JUDGESTORE_STORE_ROOT" in result.stderr  # where a root that no option gave came from


def test_browse_on_a_port_in_use_names_it_and_the_way_out(demo_folder: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = run("--store-root", str(demo_folder), "--port", port)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"cannot serve on 127.0.0.1 port {port}" in result.stderr and "--port (0: any free port)" in result.stderr


@pytest.mark.parametrize("host", ["", "  "], ids=["empty", "blank"])
def test_browse_on_an_empty_host_says_so_and_warns_of_nothing(demo_folder: Path, host: str) -> None:
    """Was: the warning that the host 'is not a loopback address', then 'Name or service not known'."""
    result = run("--store-root", str(demo_folder), "--host", host, "--port", "0")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert " ".join(result.stderr.split()) == (
        "Error: --host is empty: give an address, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
    )


def test_browse_without_its_extra_says_what_to_install(demo_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = browse_cli.importlib.util.find_spec
    monkeypatch.setattr(browse_cli.importlib.util, "find_spec", lambda name: None if name == "uvicorn" else real(name))
    result = CliRunner().invoke(build_app(), ["browse", "--store-root", str(demo_folder)])
    assert result.exit_code == 1
    assert "judgestore browse needs uvicorn" in result.output and "'.[browse]'" in result.output


def test_browse_on_another_loopback_address_answers_the_url_it_prints(demo_folder: Path) -> None:
    """127.0.0.2 is loopback (no warning), but its printed URL answered 403: only 127.0.0.1 and localhost were (was)."""
    with browse("--store-root", str(demo_folder), "--host", "127.0.0.2", "--port", "0") as (_, url, lines):
        assert url.startswith("http://127.0.0.2:")
        assert fetch(url)[0] == 200
        assert fetch(url, host="attacker.example")[0] == 403
        assert fetch(url, host="127.0.0.2.attacker.example")[0] == 403
        assert not any("not a loopback address" in line for line in lines)
