"""Fixtures of the browser's tests: the demo store (a folder, or a PostgreSQL server), the app served, Chromium.

Chromium is Debian's (``/usr/bin/chromium``, installed by ``.ci/setup``),
driven by Playwright for Python; Playwright's own browser downloads are
never used. Without either the browser tests skip, which fails under
``JS_TEST_NO_SKIPS`` (CI).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store
from store.settings import Settings
from tests.browse import demo

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def demo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo store in a folder, built once; tests only read it (and check that they did)."""
    root = tmp_path_factory.mktemp("browse") / "judgestore-data"
    with Store(Settings(), root=root) as store:
        demo.build(store)
    return root


@pytest.fixture
def demo_url(pg_url: str) -> str:
    """The demo store on the test PostgreSQL server (a database of its own)."""
    with Store(Settings(), url=pg_url) as store:
        demo.build(store)
    return pg_url


@pytest.fixture(params=["folder", pytest.param("server", marks=pytest.mark.postgres)])
def demo_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    """The demo store opened read-only, as ``judgestore browse`` opens it: a folder, then a server."""
    if request.param == "folder":
        store = Store(Settings(), root=request.getfixturevalue("demo_folder"), readonly=True)
    else:
        store = Store(Settings(), url=request.getfixturevalue("demo_url"), readonly=True)
    with store:
        yield store


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless Chromium (Debian's) driven by Playwright, for one module.

    Not for the session: Playwright's sync API holds an event loop as the
    running one until it stops, and tests of async code that run later
    (``asyncio.run``) must find none.
    """
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("Playwright is not installed (pip install playwright; the dev extra has it)")
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/setup does it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
