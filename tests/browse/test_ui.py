"""`judgestore browse` in a real browser: headless Chromium (Debian's) driven by Playwright, as a reader uses it.

A reader opens the overview, filters the rows to one instruction, opens its
battle, checks both models' answers and both orientations' verdicts (the
preference bars must show the probabilities the stored logprobs give, mapped
to the models), follows a link to a row and comes back with the back button.
A completion holding ``<script>`` must show as text and never run. The store
must not change: every file byte for byte on a folder (and no ``-wal`` or
``-shm`` appears), no row inserted, updated or deleted on a server.

``JS_WRITE_SCREENSHOTS=1`` saves the overview and the battle as the README's
screenshots (docs/img/).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from store import JudgementRecord, Store
from store.browse.browser import Browser
from store.browse.server import serving
from tests.browse import demo
from tests.factories import completion_record, file_digests

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "img"
TITLE = " · judgestore browse"


def unchanged(store: Store, request: pytest.FixtureRequest) -> Callable[[], Any]:
    """A snapshot of what a write would change: every file of a folder; a server's row write counters."""
    root = getattr(store.storage, "root", None)  # a folder store's root
    if root is not None:
        return lambda: (
            file_digests(root),
            sorted(p.name for p in root.rglob("*") if p.name.endswith(("-wal", "-shm"))),
        )
    cluster = request.getfixturevalue("pg_cluster")
    name = make_url(request.getfixturevalue("demo_url")).database

    def counters() -> tuple[Any, ...]:
        # Each backend sends its counters when it ends: wait until no other session is connected to the database.
        for _ in range(200):
            others = cluster.sql(f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}' "
                                 "AND pid <> pg_backend_pid()", name)[0][0]  # fmt: skip
            if others == 0:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the browser's connections did not end")
        # The store's own tables (the registry, each schema's tables and version table). The database-wide
        # counters of pg_stat_database also count the catalogs, which autovacuum's ANALYZE of the freshly
        # written tables updates whenever it likes: not the browser's doing.
        tables = cluster.sql(
            "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_del), 0), "
            "coalesce(sum(n_tup_hot_upd), 0), count(*) FROM pg_stat_user_tables", name
        )[0]  # fmt: skip
        return tuple(int(v) for v in tables)

    return counters


def expected_preference(store: Store, instruction: str, orientation: str) -> tuple[float, float]:
    """P(A) and P(B) of a stored judgement's first token, from its stored logprobs (the letters, any spacing)."""
    (location,) = [loc for loc in store.locations() if loc.role == "judgements"]
    record = next(
        r for r in store.open(location).query() if r.instruction_id == instruction and r.orientation == orientation
    )
    assert isinstance(record, JudgementRecord) and record.top_logprobs is not None
    p: dict[str, float] = {"A": 0.0, "B": 0.0}
    for candidate in record.top_logprobs["positions"][0]["candidates"]:
        if candidate["text"].strip() in p:
            p[candidate["text"].strip()] += math.exp(candidate["logprob"])
    return p["A"], p["B"]


def test_filter_battle_row_and_back_in_a_real_browser(
    chromium: Any, demo_store: Store, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = unchanged(demo_store, request)
    before = snapshot()
    if isinstance(before[0], dict):
        assert before[0] and before[1] == []  # every file hashed; no -wal or -shm: the writer closed cleanly
    else:
        assert before[0] > 0  # the counters saw the demo's inserts: they would see the browser's
    folder = getattr(demo_store.storage, "root", None)  # the store's root when it is a folder
    screenshots = os.environ.get("JS_WRITE_SCREENSHOTS") == "1" and folder is not None
    browsed = demo_store
    if screenshots:  # the store named as a reader names it: ./judgestore-data
        assert getattr(demo_store.storage, "root", None) is not None
        monkeypatch.chdir(getattr(demo_store.storage, "root", None).parent)
        browsed = Store(root=Path(getattr(demo_store.storage, "root", None).name), readonly=True)
    with serving(Browser(browsed)) as url:
        page = chromium.new_page(viewport={"width": 1280, "height": 860})
        try:
            page.goto(url)
            assert page.title() == "Overview" + TITLE
            assert page.locator("#databases tbody tr[data-db]").count() == 4
            if screenshots:
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SCREENSHOTS / "browse-overview.png"))

            # Filter the rows to one instruction's judgements: the filter lives in the URL.
            page.click("header.top nav >> text=Rows")
            page.select_option("select[name=role]", "judgements")
            page.fill("input[name=instruction_id]", "01-coding")
            page.click("form#filters button[type=submit]")
            page.wait_for_url("**/rows?*instruction_id=01-coding*")
            listed = page.locator("#rows tbody tr")
            assert listed.count() == 2
            assert page.locator("#rows a.instruction").all_inner_texts() == ["01-coding", "01-coding"]
            filtered_url = page.url

            # The battle: both answers side by side, both orientations, the bars mapped to the models.
            page.locator("#rows a.battle-link").first.click()
            page.wait_for_url("**/battle?**")
            assert page.title() == "Battle 01-coding" + TITLE
            answers = page.locator("article.answer")
            assert [answers.nth(i).get_attribute("data-model") for i in range(2)] == list(demo.MODELS)
            assert "reverse_words" in answers.nth(0).inner_text()
            assert demo.SCRIPT in answers.nth(1).inner_text()  # shown as text
            assert page.locator(".flag.disagree").inner_text() == "orientations disagree"
            for orientation in ("direct", "reversed"):
                card = page.locator(f'article.verdict[data-orientation="{orientation}"]')
                p_a, p_b = expected_preference(demo_store, "01-coding", orientation)
                # tiny-a (the pair's first model) holds slot A in the direct row and slot B in the reversed one
                p_first, p_second = (p_a, p_b) if orientation == "direct" else (p_b, p_a)
                bar = card.locator(".pref")
                assert float(bar.get_attribute("data-p-first") or "nan") == pytest.approx(p_first, rel=1e-12)
                assert float(bar.get_attribute("data-p-second") or "nan") == pytest.approx(p_second, rel=1e-12)
                assert bar.locator(".p-first").inner_text() == f"{p_first:.3f}"
                assert bar.locator(".p-second").inner_text() == f"{p_second:.3f}"
                width = float(bar.locator("rect.first").get_attribute("width") or "nan")
                assert width == pytest.approx(100 * p_first / (p_first + p_second), abs=1e-3)
                favoured = "tiny-a" if p_first > p_second else "tiny-b"
                assert card.get_attribute("data-favoured") == favoured
                assert f"Favours {favoured}" in card.locator(".favours").inner_text()
            assert page.evaluate("() => typeof window.__pwned") == "undefined"
            assert page.evaluate("() => document.scripts.length") == 0
            battle_url = page.url
            if screenshots:
                page.screenshot(path=str(SCREENSHOTS / "browse-battle.png"), full_page=True)

            # A row, then back twice: the battle, then the filtered rows with the filter still in the form.
            page.locator('article.answer[data-model="tiny-b"] a.row-link').click()
            page.wait_for_url("**/row?**")
            assert page.locator("#completion").inner_text() == demo.ANSWERS[("01-coding", "tiny-b")]
            assert page.title() == f"Row {page.locator('#input-hash').inner_text()[:12]}" + TITLE
            assert page.evaluate("() => typeof window.__pwned") == "undefined"
            page.go_back()
            assert page.url == battle_url and page.locator("article.verdict").count() == 2
            page.go_back()
            assert page.url == filtered_url
            assert page.input_value("input[name=instruction_id]") == "01-coding"
            assert page.locator("#rows tbody tr").count() == 2
        finally:
            page.close()
    browsed.close()
    demo_store.close()  # a server's connections end, and their counters reach the server
    assert snapshot() == before


def test_paging_through_every_row_in_the_browser(chromium: Any, demo_folder: Path) -> None:
    with Store(root=demo_folder, readonly=True) as store, serving(Browser(store)) as url:
        total = sum(store.open(location).count() for location in store.locations())
        page = chromium.new_page()
        try:
            page.goto(url + "rows?limit=10&order=oldest")
            seen: list[str] = []
            while True:  # a row is its database and its input hash (two models answer the same prompt)
                seen += page.locator("#rows tbody tr").evaluate_all(
                    "rows => rows.map(r => r.dataset.db + r.dataset.hash)"
                )
                if page.locator("#next-page").count() == 0:
                    break
                page.click("#next-page")
                page.wait_for_load_state()
            assert len(seen) == len(set(seen)) == total
            page.go_back()
            assert "after=" in page.url and page.locator("#first-page").count() == 1
        finally:
            page.close()


def test_the_write_check_sees_a_write_and_the_browser_reads_in_read_only_transactions(
    demo_store: Store, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The control for the check above: one row written changes the snapshot; and a server refuses writes."""
    if getattr(demo_store.storage, "root", None) is not None:
        shutil.copytree(getattr(demo_store.storage, "root", None), tmp_path / "copy")
        demo_store = Store(root=tmp_path / "copy", readonly=True)
    snapshot = unchanged(demo_store, request)
    before = snapshot()
    location = next(loc for loc in demo_store.locations() if loc.model == "tiny-b")
    if getattr(demo_store.storage, "root", None) is None:
        with demo_store.open(location).reading() as repo:  # what every page reads through
            assert repo.conn.exec_driver_sql("SHOW transaction_read_only").scalar_one() == "on"
    demo_store.close()
    where = (
        {"root": tmp_path / "copy"}
        if getattr(demo_store.storage, "root", None) is not None
        else {"url": request.getfixturevalue("demo_url")}
    )
    with Store(**where) as writer:  # type: ignore[arg-type]
        record = completion_record(1, model="tiny-b")
        writer.open(location).put_many([record])
    assert snapshot() != before
