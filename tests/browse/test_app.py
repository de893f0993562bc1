"""The web app's pages through Starlette's test client, on the demo store in a folder and on a server.

What a reader relies on: every stored string is escaped (no page holds a
``<script>`` element at all: the app ships no script), the security headers
are on every response, a loopback app answers loopback names only, bad
input gets a page that names it, and a database that cannot be read is
reported without breaking the page.
"""

from __future__ import annotations

import dataclasses
import html as html_module
import math
import re
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from store import InvalidInputError, Store, text_logprobs
from store.browse import browser as browser_module
from store.browse.app import create_app
from store.browse.browser import Browser
from store.browse.render import SHOWN_CHARS
from store.descriptor import input_hash, render_messages
from store.logprobs import PositionLogprobs, TokenLogprob, encode
from store.runs import record_run
from store.settings import Settings
from store.tables.records import JudgementRecord
from tests.browse import demo
from tests.factories import QWEN, completion_record, judgement_record, settled
from tests.store.test_runs import run

LOCAL = "http://127.0.0.1:8765"


@pytest.fixture
def client(demo_store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(Browser(demo_store)), base_url=LOCAL) as c:
        yield c


def get(client: TestClient, path: str, status: int = 200, **params: Any) -> str:
    response = client.get(path, params=params or None)  # (an empty mapping would drop the path's own query)
    assert response.status_code == status, response.text[-2000:]
    assert "<script" not in response.text.lower()
    assert "Traceback" not in response.text
    return response.text


def names_of(store: Store) -> dict[str, str]:
    """Database name by descriptor model (the demo's older tiny-a database is "tiny-a@old")."""
    from store.browse.pages import database_name

    found = {}
    for location in store.locations():
        old = location.descriptor_hash16 == demo.OLD.hash16()
        found[location.model + ("@old" if old else "")] = database_name(location)
    return found


def test_every_page_answers_with_the_security_headers(client: TestClient) -> None:
    for path, params in [
        ("/", {}),
        ("/rows", {}),
        ("/rows", {"q": "lighthouse", "orientation": "direct"}),
        ("/battle", {"benchmark": demo.BENCH, "instruction_id": "01-coding"}),
        ("/judges", {}),
        ("/judges", {"judge": demo.JUDGE}),
        ("/static/style.css", {}),
    ]:
        response = client.get(path, params=params)
        assert response.status_code == 200, (path, response.text[-500:])
        headers = response.headers
        assert "script-src 'none'" in headers["content-security-policy"]
        assert "img-src 'self'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
        assert re.fullmatch(r"app;dur=\d+\.\d", headers["server-timing"])


def test_a_stored_script_is_text_on_every_page(client: TestClient, demo_store: Store) -> None:
    escaped = "&lt;script&gt;document.title="  # markdown keeps the quotes as they are; templates escape them too
    battle = get(client, "/battle", benchmark=demo.BENCH, instruction_id="01-coding")
    assert escaped in battle
    rows = get(client, "/rows", instruction_id="01-coding")
    assert escaped in rows
    answer = re.search(r'href="(/row\?db=[^"]+)"', battle.split('data-model="tiny-b"')[1])
    assert answer is not None
    row = get(client, answer.group(1).replace("&amp;", "&"))
    assert escaped in row


def test_the_overview_lists_every_database_with_its_figures(client: TestClient, demo_store: Store) -> None:
    html = get(client, "/")
    names = names_of(demo_store)
    for name in names.values():
        assert f'data-db="{name}"' in html
    assert "stop&nbsp;24" in html  # the judge's 24 rows, all finished by stop
    assert "2026-03-01 14:01:00" in html  # the completion databases' last recorded run
    assert "260 tokens in, 156 out, ~3.2 s" in html  # what tiny-b's rerun (13 hits) saved
    assert html.count(">current<") == 4
    assert f'href="/judges?judge={demo.JUDGE}"' in html


def test_the_overview_total_leaves_out_the_rows_of_a_database_that_needs_attention(
    demo_folder: Path, tmp_path: Path
) -> None:
    """A database whose metadata.json was edited counted in the overview's total without a word, where `ls` leaves
    its rows out and says so (was)."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)

    def total() -> tuple[int, str]:
        reader = Store(Settings(), root=root, readonly=True)
        with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
            html = get(client, "/")
        reader.close()
        found = re.search(r'<p class="lede">\d+ databases, ([\d,]+) rows', html)
        assert found is not None
        return int(found.group(1).replace(",", "")), html

    before, html = total()
    assert 'id="not-counted"' not in html
    edited = next(root.glob("completions/*/*/tiny-b/*/metadata.json"))
    edited.write_text(edited.read_text().replace('"max_tokens": 24', '"max_tokens": 25'))
    with closing(sqlite3.connect(edited.with_name("completions.db"))) as conn:
        (its_rows,) = conn.execute("SELECT count(*) FROM completions").fetchone()
    after, html = total()
    assert its_rows > 0 and after == before - its_rows
    assert "1 database needs attention (below): its rows are not counted." in html


def test_finish_reasons_of_large_databases_are_counted_when_asked(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browser_module, "AUTO_COUNT_ROWS", 13)
    html = get(client, "/")
    assert html.count('href="/?finish_reasons=count"') == 2  # tiny-a (14 rows) and the judge (24)
    counted = get(client, "/", finish_reasons="count")
    assert "finish_reasons=count" not in counted and "stop&nbsp;24" in counted
    assert "finish_reasons=count" not in get(client, "/")  # kept while the database is unchanged


def test_a_finish_reasons_count_is_written_with_thousands_separators(tmp_path: Path) -> None:
    """ "stop 100010" beside a rows column of 100,010 (was)."""
    with Store(Settings(), root=tmp_path) as store:
        store.database("completions", "t", QWEN).put_many([completion_record(i) for i in range(1_234)])
    with (
        Store(Settings(), root=tmp_path, readonly=True) as store,
        TestClient(create_app(Browser(store)), base_url=LOCAL) as c,
    ):
        html = get(c, "/", finish_reasons="count")
    assert "stop&nbsp;1,234" in html and ">1,234</a>" in html


def test_an_overview_reads_again_only_the_databases_that_changed(
    demo_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each overview opened every database and read its runs (was): seconds for a store of thousands of them.
    What it read is kept in the store's catalog while a database's files are unchanged, for the next browser too."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    settled()
    opened: list[Any] = []
    real_open = Store.open
    monkeypatch.setattr(Store, "open", lambda self, location: opened.append(location) or real_open(self, location))
    with Store(Settings(), root=root, readonly=True) as store:
        first = Browser(store).overview()
    assert len(opened) == 4
    opened.clear()
    with Store(Settings(), root=root, readonly=True) as store:
        again = Browser(store).overview()  # a browser started later: nothing to open
    assert opened == [] and again == first
    changed = first[0].location
    with Store(Settings(), root=root) as writer:
        record_run(writer.open(changed), dataclasses.replace(run(9), run_id="later"))
    opened.clear()
    with Store(Settings(), root=root, readonly=True) as store:
        after = Browser(store).overview()
    assert opened == [changed] and after[0].runs.runs == first[0].runs.runs + 1  # type: ignore[union-attr]
    assert after[1:] == first[1:]


@pytest.fixture(params=["folder", pytest.param("server", marks=pytest.mark.postgres)])
def reopened(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A function opening the demo store (a copy of its folder, or its server database): read-only as the browser
    opens it, or read-write as a run beside it does."""
    if request.param == "folder":
        root = tmp_path / "store"
        shutil.copytree(request.getfixturevalue("demo_folder"), root)
        settled()  # copied files just changed: a catalog taken now would not be believed
        return lambda readonly=True: Store(Settings(), root=root, readonly=readonly)
    url = request.getfixturevalue("demo_url")
    return lambda readonly=True: Store(Settings(), url=url, readonly=readonly)


def test_judge_totals_are_read_again_only_from_judgements_databases_that_changed(
    reopened: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overview shows every judge's total: it opened every judgements database on every request (was), 1-4 s
    at 1,000-3,000 PostgreSQL schemas. The counts are kept in the store's catalog while a database is unchanged."""
    opened: list[Any] = []
    real = Store.open_existing
    monkeypatch.setattr(Store, "open_existing", lambda self, loc: opened.append(loc) or real(self, loc))
    with reopened() as store:
        first = Browser(store).judges()
    assert first.totals == {demo.JUDGE: 24} and len(opened) == 1
    opened.clear()
    with reopened() as store:
        assert Browser(store).judges() == first and opened == []  # a browser started later: nothing to open
    with reopened(readonly=False) as writer:
        (judged,) = [loc for loc in writer.locations() if loc.role == "judgements"]
        writer.open(judged).put_many([judgement_record(i, judge=demo.JUDGE) for i in range(3)])
    opened.clear()
    with reopened() as store:
        assert Browser(store).judges().totals == {demo.JUDGE: 27} and opened == [judged]


def test_finish_reasons_counted_when_asked_are_counted_again_once_the_database_changes(
    reopened: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a server store a count was kept for 60 s whatever changed (was): its reasons no longer added up to the
    rows shown beside them. Now a count is kept while the database is unchanged, on either backend."""
    monkeypatch.setattr(browser_module, "AUTO_COUNT_ROWS", 13)
    with reopened() as store:
        browser = Browser(store)
        judge = next(s for s in browser.overview(count_all=True) if s.location.role == "judgements")
        assert judge.finish_reasons == {"stop": 24}
        assert next(s for s in browser.overview() if s.location == judge.location).finish_reasons == {"stop": 24}
        with reopened(readonly=False) as writer:  # another process, while the browser runs
            more = [judgement_record(i, judge=demo.JUDGE, finish_reason="length") for i in range(7)]
            writer.open(judge.location).put_many(more)
        unasked = next(s for s in browser.overview() if s.location == judge.location)
        assert (unasked.rows, unasked.finish_reasons) == (31, None)  # not counted again unasked: no stale count
        counted = next(s for s in browser.overview(count_all=True) if s.location == judge.location)
        assert counted.finish_reasons == {"stop": 24, "length": 7}


@pytest.mark.postgres
def test_a_battle_on_a_server_opens_only_the_judgements_schemas_holding_its_instruction(
    demo_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: every judgements schema of the benchmark was opened (about 7 statements each: 3.4-3.8 s at 3,000)."""
    with Store(Settings(), url=demo_url) as writer:  # another judge of the same benchmark, on other instructions
        other = writer.database("judgements", demo.TASK, demo.descriptor("other-judge", max_tokens=8, logprobs=5))
        other.put_many([judgement_record(i, benchmark=demo.BENCH, judge="other-judge") for i in range(3)])
    opened: list[Any] = []
    real = Store.open_existing
    monkeypatch.setattr(Store, "open_existing", lambda self, loc: opened.append(loc) or real(self, loc))
    with Store(Settings(), url=demo_url, readonly=True) as store:
        battle = Browser(store).battle(demo.BENCH, "01-coding")
    assert [j.judge for j in battle.judges] == [demo.JUDGE]
    assert [loc.model for loc in opened if loc.role == "judgements"] == [demo.JUDGE]
    with Store(Settings(), url=demo_url, readonly=True) as store:
        theirs = Browser(store).battle(demo.BENCH, "1")  # the other judge's instruction: found there
    assert [j.judge for j in theirs.judges] == ["other-judge"] and theirs.pairs == [("model-a", "model-b")]


def test_the_battle_shows_both_answers_each_verdict_mapped_to_models_and_the_disagreement(
    client: TestClient, demo_store: Store
) -> None:
    html = get(client, "/battle", benchmark=demo.BENCH, instruction_id="01-coding")
    assert "reverse_words" in html and "Use <code>split</code> and <code>join</code>" in html
    assert html.count('class="verdict"') == 2 and "orientations disagree" in html
    for orientation, a in (("direct", "tiny-a"), ("reversed", "tiny-b")):
        card = html.split(f'data-orientation="{orientation}"')[1]
        p_first, p_second = (
            float(x) for x in re.search(r'data-p-first="([^"]+)" data-p-second="([^"]+)"', card).groups()
        )  # type: ignore[union-attr]
        p_a, p_b = demo.FIRST_TOKEN[("01-coding", orientation)]
        # tiny-a is the first model of the pair: slot A in the direct row, slot B in the reversed one
        assert (p_first, p_second) == pytest.approx((p_a, p_b) if a == "tiny-a" else (p_b, p_a), rel=1e-9)
    agreeing = get(client, "/battle", benchmark=demo.BENCH, instruction_id="00-writing")
    assert "orientations agree" in agreeing and "orientations disagree" not in agreeing


def test_a_battle_shows_a_pair_of_two_models_before_a_model_judged_against_itself(
    demo_folder: Path, tmp_path: Path
) -> None:
    """A self-judgement (tiny-a against tiny-a) sorts first: it was the pair shown, the real battle only behind
    "Pairs judged" (was)."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    itself = judgement_record(0, benchmark=demo.BENCH, instruction_id="01-coding", model_a="tiny-a", model_b="tiny-a",
                              judge=demo.JUDGE)  # fmt: skip
    with Store(Settings(), root=root) as store:
        store.database("judgements", demo.TASK, demo.descriptor(demo.JUDGE)).put_many([itself])
    with (
        Store(Settings(), root=root, readonly=True) as reader,
        TestClient(create_app(Browser(reader)), base_url=LOCAL) as client,
    ):
        html = get(client, "/battle", benchmark=demo.BENCH, instruction_id="01-coding")
        asked = get(client, "/battle", benchmark=demo.BENCH, instruction_id="01-coding", a="tiny-a", b="tiny-a")
    assert html.count('class="verdict"') == 2 and "orientations disagree" in html  # tiny-a against tiny-b
    assert asked.count('class="verdict"') == 1  # still there when asked for


def test_a_battle_without_verdicts_claims_no_agreement_and_a_clipped_answer_says_so(tmp_path: Path) -> None:
    """Judge texts with no verdict in either orientation agree on nothing; an answer longer than a page shows is
    cut with the count of what was left out, as on the row page (its end was once dropped without a word)."""
    store = Store(Settings(store_root=tmp_path), root=tmp_path)
    question = [{"role": "user", "content": "Which is better?"}]
    long_answer = "x" * SHOWN_CHARS + " THE END"
    store.database("completions", demo.TASK, demo.descriptor("tiny-a")).put_many(
        [demo.completion("tiny-a", "q1", question, long_answer, 0)]
    )
    store.database("completions", demo.TASK, demo.descriptor("tiny-b")).put_many(
        [demo.completion("tiny-b", "q1", question, "Short.", 1)]
    )
    undecided = []
    for orientation, (a, b) in (("direct", ("tiny-a", "tiny-b")), ("reversed", ("tiny-b", "tiny-a"))):
        rendered = render_messages(demo.judge_prompt("Which is better?", a, b))
        undecided.append(
            JudgementRecord(
                input_hash=input_hash(rendered),
                input_text=rendered,
                completion="I cannot tell.",
                benchmark=demo.BENCH,
                instruction_id="q1",
                model_a=a,
                model_b=b,
                judge=demo.JUDGE,
                orientation=orientation,
                finish_reason="stop",
                run_id="r",
                created_by="t",
                created_at=demo.T0,
            )
        )
    store.database("judgements", demo.TASK, demo.descriptor(demo.JUDGE)).put_many(undecided)
    store.close()

    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        html = get(client, "/battle", benchmark=demo.BENCH, instruction_id="q1")
        judge = " ".join(get(client, "/judges", judge=demo.JUDGE).split())
    reader.close()

    assert "0 verdicts read from the stored logprobs, 0 from the text, 2 with no verdict found." in judge
    assert html.count("No verdict found") == 2
    assert "orientations agree" not in html and "orientations disagree" not in html
    assert "THE END" not in html and "8 more characters not shown" in html


def test_a_row_with_an_empty_instruction_id_gets_no_link_that_would_name_another(tmp_path: Path) -> None:
    """The links drop empty parameters: an empty id's battle link asked for no instruction (a 400), and its
    instruction link listed every row."""
    store = Store(Settings(store_root=tmp_path), root=tmp_path)
    question = [{"role": "user", "content": "Hi"}]
    store.database("completions", demo.TASK, demo.descriptor("tiny-a")).put_many(
        [
            demo.completion("tiny-a", "", question, "Hello.", 0),
            demo.completion("tiny-a", "q2", [question[0] | {"content": "Yo"}], "Hey.", 1),
        ]
    )
    store.close()

    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        html = get(client, "/rows")
    reader.close()

    assert html.count('class="row-link hash"') == 2
    assert html.count('class="battle-link"') == 1 and html.count('class="instruction"') == 1  # q2's only


def test_a_stored_nul_is_shown_as_a_symbol_never_sent_raw(tmp_path: Path) -> None:
    """A browser drops a U+0000 it is sent, and markdown turned it into U+FFFD: both hid that the text holds one."""
    store = Store(Settings(store_root=tmp_path), root=tmp_path)
    question = [{"role": "user", "content": "Hi\x00there"}]
    store.database("completions", demo.TASK, demo.descriptor("tiny-a")).put_many(
        [demo.completion("tiny-a", "q1", question, "ab\x00cd", 0)]
    )
    store.close()

    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        listing = get(client, "/rows")
        (href,) = re.findall(r'class="row-link hash" href="([^"]+)"', listing)
        row = get(client, href.replace("&amp;", "&"))
    reader.close()

    assert "Hi\u2400there" in listing and "\x00" not in listing
    assert "Hi\u2400there" in row and "ab\u2400cd" in row
    assert "\x00" not in row and "\ufffd" not in row


def test_bidirectional_overrides_in_stored_text_are_shown_escaped_and_reorder_nothing(tmp_path: Path) -> None:
    """A right-to-left override in a model's name or a finish reason reversed the page's own text after it (the
    overview's "17 rows" read "71"; was): each embedding, override or isolate is shown as its escape; the marks that
    right-to-left text needs are kept."""
    model, reason = "m\u202eodel", "st\u2067op"
    question = [{"role": "user", "content": "\u05e9\u05dc\u05d5\u05dd\u200f? \u202dforced"}]
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        record = demo.completion(model, "q1", question, "x \u202e<b>y</b>", 0)
        store.database("completions", demo.TASK, demo.descriptor(model)).put_many(
            [dataclasses.replace(record, finish_reason=reason)]
        )
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        pages = [get(client, "/"), listing := get(client, "/rows"), get(client, "/rows", model=model)]
        (href,) = re.findall(r'class="row-link hash" href="([^"]+)"', listing)
        pages += [get(client, href.replace("&amp;", "&")), get(client, "/battle", benchmark=demo.BENCH,
                                                                instruction_id="q1")]  # fmt: skip
        # A form field keeps what was typed: sent back, it asks for the same rows (its escape found none; was)
        (typed,) = re.findall(r'<input name="model" value="([^"]*)"', pages[2])
        again = get(client, "/rows", model=html_module.unescape(typed))
    reader.close()
    assert html_module.unescape(typed) == model and again.count('class="row-link hash"') == 1
    for html in pages:
        assert not re.search("[\u202a-\u202e\u2066-\u2069]", re.sub(r"<input [^>]*>", "", html))
        assert "m\\u202eodel" in html
    assert "st\\u2067op" in pages[3] and "x \\u202e&lt;b&gt;y&lt;/b&gt;" in pages[3]  # escaped, and still escaped
    assert "\u200f" in pages[3] and "\\u202dforced" in pages[3]  # the mark kept, the override shown


def test_a_multi_turn_battle_shows_each_turn_with_each_models_answer(client: TestClient) -> None:
    html = get(client, "/battle", benchmark=demo.BENCH, instruction_id="02-multi")
    turns = html.split('class="round"')[1:]
    assert len(turns) == 2
    assert "Name a prime number." in turns[0] and "Seven." in turns[0] and "Two." in turns[0]
    assert demo.FOLLOW_UP in turns[1] and "Eleven is bigger." in turns[1] and "Thirteen." in turns[1]


def test_a_verdict_read_from_the_text_says_so(client: TestClient) -> None:
    html = get(client, "/battle", benchmark=demo.BENCH, instruction_id="03-text")
    assert html.count("no A/B token among the stored logprobs; verdict read from the text") == 2
    assert html.count("Favours <b>tiny-b</b>") == 2 and "orientations agree" in html


def test_the_row_page_shows_every_logprob_position_the_descriptor_and_the_runs(
    client: TestClient, demo_store: Store
) -> None:
    names = names_of(demo_store)
    judge = demo_store.open(next(loc for loc in demo_store.locations() if loc.model == demo.JUDGE))
    record = next(r for r in judge.query() if r.instruction_id == "00-writing" and r.orientation == "reversed")
    html = get(client, "/row", db=names[demo.JUDGE], hash=record.input_hash)
    table = html.split('id="logprobs"')[1].split("</table>")[0]
    assert table.count("<tr class=") == 4  # the four stored candidates of the first position
    for text, logprob in text_logprobs(record.top_logprobs).items():
        assert f'<code class="token">"{text}"</code>' in table and f"{logprob:.4f}" in table
        assert f"{math.exp(logprob):.4f}" in table
    stored = judge.metadata()
    assert f"&#34;descriptor_sha256&#34;: &#34;{stored.descriptor_sha256}&#34;" in html
    if getattr(judge, "path", None) is not None:  # a folder: the page shows the file's bytes
        metadata = (judge.path.parent / "metadata.json").read_text()
        assert metadata.strip().replace('"', "&#34;") in html
    completions = demo_store.open(next(loc for loc in demo_store.locations() if loc.model == "tiny-b"))
    written = next(iter(completions.query()))
    runs = get(client, "/row", db=names["tiny-b"], hash=written.input_hash).split('id="runs"')[1]
    assert "<td>wrote</td>" in runs and "run-demo" in runs
    assert "<td>later, with hits</td>" in runs and "run-again" in runs


def test_an_adopted_row_names_its_source_and_the_adoption(client: TestClient, demo_store: Store) -> None:
    names = names_of(demo_store)
    target = demo_store.open(
        next(loc for loc in demo_store.locations() if loc.descriptor_hash16 == demo.descriptor("tiny-a").hash16())
    )
    adopted = next(r for r in target.query() if r.adopted_from is not None)
    html = get(client, "/row", db=names["tiny-a"], hash=adopted.input_hash).split('id="adopted-from"')[1]
    assert demo.OLD.sha256() in html and f'href="/rows?db={names["tiny-a@old"].replace("/", "%2F")}"' in html
    assert "across backend_version; audit 1/1 exact" in html


@pytest.mark.parametrize(
    ("path", "params", "status", "message"),
    [
        ("/rows", {"since": "yesterday"}, 400, "&#39;yesterday&#39; is not an ISO-8601 date"),
        ("/rows", {"orientation": "sideways"}, 400, "orientation must be one of direct, reversed"),
        ("/rows", {"limit": "9999"}, 400, "limit must be between 1 and 500"),
        # a search PostgreSQL takes seconds to compile, every other page waiting (was: served, slowly)
        ("/rows", {"q": "x" * 1001}, 400, "the search is 1,001 characters long; search at most 1,000"),
        ("/rows", {"after": "not-a-cursor"}, 400, "the page cursor"),
        ("/battle", {}, 400, "the page needs the instruction_id parameter"),
        ("/battle", {"instruction_id": "1", "a": "x"}, 400, "a pair needs both models"),
        ("/battle", {"benchmark": "nope", "instruction_id": "1"}, 404, "no row of instruction nope/1"),
        (
            "/battle",
            {"benchmark": demo.BENCH, "instruction_id": "01-coding", "a": "x", "b": "y"},
            404,
            f"no row of x or y for instruction {demo.BENCH}/01-coding",
        ),
        ("/rows", {"db": "nope"}, 404, "no database nope"),
        # a cursor whose time in UTC is before year 1 (or after 9999): no row has it
        ("/rows", {"after": "WyIwMDAxLTAxLTAxVDAwOjAwOjAwKzIzOjU5IiwiYSIsImIiXQ"}, 400, "not one this browser made"),
        ("/judges", {"judge": "nobody"}, 404, "no judgement by judge &#39;nobody&#39;"),
        ("/row", {"db": "completions/x", "hash": "0" * 64}, 404, "no database completions/x"),
        ("/nowhere", {}, 404, "no page at /nowhere"),
    ],
)
def test_bad_input_gets_a_page_that_names_it(
    client: TestClient, path: str, params: dict[str, str], status: int, message: str
) -> None:
    assert message in get(client, path, status, **params)


def test_a_link_to_an_instruction_keeps_the_filters_of_the_page(client: TestClient) -> None:
    page = get(client, "/rows", role="completions", model="tiny-a", limit=5)
    links = re.findall(r'class="instruction" href="([^"]+)"', page)
    assert links
    followed = get(client, links[0].replace("&amp;", "&"))
    assert "tiny-a" in followed and "No rows" not in followed
    shown = re.findall(r'class="instruction" href="[^"]+">([^<]+)<', followed)
    assert shown and set(shown) == {re.findall(r'class="instruction" href="[^"]+">([^<]+)<', page)[0]}
    assert "role=completions" in links[0] and "model=tiny-a" in links[0] and "limit=5" in links[0]


def test_the_filter_form_keeps_every_filter_of_the_url(client: TestClient) -> None:
    """Filtering again (a new order, say) dropped a repeated finish reason but one, which then matched nothing, and
    the page's limit (was): the README says every filter is in the URL."""
    response = client.get("/rows?finish_reason=length&finish_reason=stop&limit=7&role=completions")
    assert response.status_code == 200
    (form,) = re.findall(r'<form class="filters".*?</form>', response.text, re.S)
    assert re.findall(r'name="finish_reason" value="([^"]*)"', form) == ["length", "stop"]
    assert '<input type="hidden" name="limit" value="7">' in form
    (bare,) = re.findall(r'<form class="filters".*?</form>', get(client, "/rows"), re.S)
    assert re.findall(r'name="finish_reason" value="([^"]*)"', bare) == [""] and 'name="limit"' not in bare


def test_a_row_hash_that_is_no_input_hash_is_a_bad_request(client: TestClient, demo_store: Store) -> None:
    """A malformed hash is the reader's mistake (400, naming it, not the library's get_many), not a row that is
    absent (404); one in capitals is found, as query --input-hash finds it (it was refused)."""
    database = names_of(demo_store)[demo.JUDGE]
    for short in ("ab", "AB"):
        refused = get(client, "/row", 400, db=database, hash=short)
        assert "hash must be a whole input hash (64 hex digits), got &#39;ab&#39;" in refused
        assert "get_many" not in refused
    assert "no row" in get(client, "/row", 404, db=database, hash="0" * 64)
    (href,) = re.findall(r'class="row-link hash" href="([^"]+)"', get(client, "/rows", db=database, limit=1))
    hash_ = href.rpartition("hash=")[2]
    assert f'id="input-hash">{hash_}<' in get(client, "/row", db=database, hash=hash_.upper())


def test_a_loopback_app_answers_loopback_names_only(demo_folder: Path) -> None:
    with Store(Settings(), root=demo_folder, readonly=True) as store:
        app = create_app(Browser(store))
        for base, status in [(LOCAL, 200), ("http://localhost:8765", 200), ("http://[::1]:8765", 200),
                             ("http://evil.example", 403), ("http://127.0.0.1.evil.example:8765", 403)]:  # fmt: skip
            assert TestClient(app, base_url=base).get("/").status_code == status, base
        # no host at all: refused as any other, never a 500; a user part is no host's (evil.com@ was dropped)
        for host in ("[", "[::1", "::1]", "evil.example@127.0.0.1", "@localhost"):
            assert TestClient(app, base_url=LOCAL).get("/", headers={"host": host}).status_code == 403, host
        assert (
            TestClient(create_app(Browser(store), loopback_only=False), base_url="http://lan-host").get("/").status_code
            == 200
        )


def test_the_browser_only_reads_a_store_opened_read_only(demo_folder: Path) -> None:
    with Store(Settings(), root=demo_folder) as store, pytest.raises(InvalidInputError, match="readonly=True"):
        Browser(store)


def test_a_database_that_cannot_be_read_is_reported_and_the_rest_still_shows(demo_folder: Path, tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    judge_db = next(root.glob("judgements/*/*/*/*/judgements.db"))
    judge_db.write_bytes(b"this is not a database" * 100)
    with (
        Store(Settings(), root=root, readonly=True) as store,
        TestClient(create_app(Browser(store)), base_url=LOCAL) as c,
    ):
        overview = get(c, "/")
        assert "not-a-database" in overview and str(judge_db) in overview
        rows = get(c, "/rows")
        assert "Skipped judgements/" in rows and "tiny-a" in rows
        battle = get(c, "/battle", benchmark=demo.BENCH, instruction_id="00-writing")
        assert "Skipped judgements/" in battle and "The keeper found a <strong>bottle</strong>." in battle


def test_a_database_damaged_past_its_first_page_is_skipped_on_the_battle_page(
    demo_folder: Path, tmp_path: Path
) -> None:
    """A database that opens but fails midway through a read made every battle page a 500 (was); /rows skipped it."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    (damaged,) = [db for db in root.glob("completions/*/*/tiny-a/*/completions.db") if b"00-writing" in db.read_bytes()]
    data = bytearray(damaged.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    data[page_size : 5 * page_size] = b"Z" * (4 * page_size)  # pages 2-5: it opens, then a read of its rows fails
    damaged.write_bytes(bytes(data))
    with (
        Store(Settings(), root=root, readonly=True) as store,
        TestClient(create_app(Browser(store)), base_url=LOCAL) as c,
    ):
        battle = get(c, "/battle", benchmark=demo.BENCH, instruction_id="00-writing")
    assert "Skipped completions/" in battle and "is damaged" in battle
    assert "A bottle washed up; the keeper read it and wept." in battle  # tiny-b's answer, from its own database


def test_a_battle_whose_rows_are_all_in_databases_it_could_not_read_names_them_in_its_404(
    demo_folder: Path, tmp_path: Path
) -> None:
    """ "no row of instruction ..." (was), when its rows were there, in databases the page skipped unsaid."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    for database in root.glob("*/*/*/*/*/*.db"):
        database.write_bytes(b"this is not a database" * 100)
    with (
        Store(Settings(), root=root, readonly=True) as store,
        TestClient(create_app(Browser(store)), base_url=LOCAL) as c,
    ):
        response = c.get("/battle", params={"benchmark": demo.BENCH, "instruction_id": "00-writing"})
    html = " ".join(response.text.split())
    assert response.status_code == 404 and "no row of instruction" in html
    assert "could not read may hold them" in html and "is not an SQLite database" in html


def test_verdicts_without_a_judge_and_a_row_without_an_instruction_get_no_link_that_leads_nowhere(
    tmp_path: Path,
) -> None:
    """Judge-less verdicts linked to /judges?judge=(no judge), a 404; a row page's battle link for an empty
    instruction id asked for no instruction, a 400; the overview's count of rows without a finish reason linked to
    every row (was)."""
    store = Store(Settings(store_root=tmp_path), root=tmp_path)
    judged = []
    for instruction, judge in (("q1", None), ("", demo.JUDGE)):
        rendered = render_messages(demo.judge_prompt(f"Question {instruction}?", "A says", "B says"))
        fields = {"benchmark": demo.BENCH, "instruction_id": instruction, "model_a": "tiny-a", "model_b": "tiny-b",
                  "judge": judge, "orientation": "direct", "finish_reason": "stop", "run_id": "r"}  # fmt: skip
        judged.append(
            JudgementRecord(
                input_hash=input_hash(rendered), input_text=rendered, completion="[[A]]", created_by="t",
                created_at=demo.T0, **fields,  # type: ignore[arg-type]
            )
        )  # fmt: skip
    database = store.database("judgements", demo.TASK, demo.descriptor(demo.JUDGE))
    database.put_many(judged)
    question = [{"role": "user", "content": "Hi"}]
    store.database("completions", demo.TASK, demo.descriptor("tiny-a")).put_many(
        [dataclasses.replace(demo.completion("tiny-a", "q1", question, "", 0), finish_reason=None)]
    )
    store.close()

    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        battle = get(client, "/battle", benchmark=demo.BENCH, instruction_id="q1")
        overview = get(client, "/")
        (href,) = re.findall(r'class="row-link hash" href="([^"]+)"', get(client, "/rows", judge=demo.JUDGE))
        row = get(client, href.replace("&amp;", "&"))
    reader.close()
    assert "<h3>(no judge)" in battle and "judge=%28no" not in battle and "/judges?" not in battle
    assert judged[1].input_hash in row and 'class="battle-link"' not in row
    # The count of rows with no finish reason linked to every row of the database (was): no filter selects them
    (reasons,) = re.findall(r'data-db="completions/.*?<td class="reasons">(.*?)</td>', overview, re.DOTALL)
    assert "(none)&nbsp;1" in reasons and "<a" not in reasons and "null" not in reasons  # read "null 1" (was)


def test_a_battle_asked_without_its_benchmark_says_it_looked_for_rows_without_one(client: TestClient) -> None:
    """It said the instruction had no row, though every row of it has a benchmark (was)."""
    page = get(client, "/battle", 404, instruction_id="00-writing")
    assert "no row of instruction 00-writing without a benchmark (give benchmark= for a benchmark&#39;s)" in page


def _judgement(instruction: str, orientation: str, completion: str, top_logprobs: Any, minute: int = 0) -> Any:
    """A pairwise judgement of tiny-a and tiny-b (A = tiny-a in the direct orientation)."""
    a, b = ("tiny-a", "tiny-b") if orientation == "direct" else ("tiny-b", "tiny-a")
    rendered = render_messages(demo.judge_prompt(f"Question {instruction}?", a, b))
    return JudgementRecord(
        input_hash=input_hash(rendered), input_text=rendered, completion=completion, benchmark=demo.BENCH,
        instruction_id=instruction, model_a=a, model_b=b, judge=demo.JUDGE, orientation=orientation,
        finish_reason="stop", run_id="r", created_by="t", created_at=demo.T0 + timedelta(minutes=minute),
        top_logprobs=top_logprobs,
    )  # fmt: skip


def test_the_row_page_shows_a_sampled_token_kept_apart_from_the_candidates_with_its_logprob(tmp_path: Path) -> None:
    """A sampled token ranked below the candidates kept (allowed_token_ids: the unrestricted logprobs) showed its
    rank alone, its logprob nowhere; a position stored with its sampled token alone (no candidates) had no row."""
    below = PositionLogprobs(
        (TokenLogprob("x", -0.1, 7, 1), TokenLogprob("y", -2.0, 8, 2)), TokenLogprob("A", -9.0, 35, 304)
    )
    alone = PositionLogprobs((), TokenLogprob("]]", -0.25, 40, 1))
    kept = PositionLogprobs(
        (TokenLogprob("B", -0.5, 36, 1), TokenLogprob("A", -1.5, 35, 2)), TokenLogprob("B", -0.5, 36, 1)
    )
    row = _judgement("q0", "direct", "A]]B", encode([below, alone, kept]))
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        store.database("judgements", demo.TASK, demo.descriptor(demo.JUDGE)).put_many([row])
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        html = get(client, "/row", db=next(iter(names_of(reader).values())), hash=row.input_hash)
    reader.close()
    table = html.split('id="logprobs"')[1].split("</table>")[0]
    positions = [part.split("</td>")[0] for part in table.split('<td rowspan="')[1:]]
    assert positions[0] == '2">0'
    said = " ".join(positions[1].split())
    assert said.endswith("(rank 304; not among the candidates kept: logprob -9.0000, P 0.0001)"), said
    assert positions[2] == '1">1' and "(rank 1; not among the candidates kept: logprob -0.2500, P 0.7788)" in table
    assert positions[4] == '2">2' and "(rank 1)" in positions[5]  # among the candidates: its row is the marked one
    assert table.count('<tr class="sampled">') == 1 and table.count("<tr class=") == 5  # 2 + 1 (alone) + 2


def test_stored_logprobs_that_cannot_be_read_leave_the_verdict_to_the_text_and_say_so(tmp_path: Path) -> None:
    """A value another tool stored (not the store's logprobs) made /rows, /battle and the judge page a 400 "Bad
    request" (was): a value in the store is no bad request."""
    unreadable = [{"A": "x"}, {"A": None}, {"format": "weird"}, {"positions": [{"candidates": [{"bad": 1}]}]}]
    rows = [_judgement(f"q{i}", "direct", "[[B]]", value, i) for i, value in enumerate(unreadable)]
    rows.append(_judgement("q0", "reversed", "[[A]]", demo.first_token(0.8, 0.1), 9))  # readable: A = tiny-b
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        store.database("judgements", demo.TASK, demo.descriptor(demo.JUDGE)).put_many(rows)

    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        listing = get(client, "/rows")
        battle = get(client, "/battle", benchmark=demo.BENCH, instruction_id="q0")
        judge = " ".join(get(client, "/judges", judge=demo.JUDGE).split())
        row = get(client, "/row", db=next(iter(names_of(reader).values())), hash=rows[0].input_hash)
    reader.close()

    assert listing.count("logprobs unreadable") == 4 and listing.count(">P(A) 0.80") == 1
    assert battle.count("the stored logprobs could not be read; verdict read from the text") == 1
    assert battle.count("Favours <b>tiny-b</b>") == 2  # the text's [[B]] (direct), the logprobs' A (reversed)
    assert "1 verdicts read from the stored logprobs, 4 from the text" in judge
    assert "4 whose stored logprobs could not be read" in judge
    assert "The stored logprobs could not be read:" in row and "Favours <b>tiny-b</b>" in row


def test_a_position_past_the_verdict_token_is_not_read(tmp_path: Path) -> None:
    """Every page decoded every stored position of a judge's row (was): the cost grew with the positions stored, and
    one past the verdict token that could not be read hid the verdict token's preference."""
    value = dict(demo.first_token(0.8, 0.1))
    value["positions"] = [*value["positions"], *[{"candidates": [{"bad": i}]} for i in range(3)]]  # type: ignore[misc]
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        store.database("judgements", demo.TASK, demo.descriptor(demo.JUDGE)).put_many(
            [_judgement("q0", "direct", "reasoning... [[A]]", value)]
        )
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        listing = get(client, "/rows")
        battle = get(client, "/battle", benchmark=demo.BENCH, instruction_id="q0")
        judge = " ".join(get(client, "/judges", judge=demo.JUDGE).split())
    reader.close()
    assert ">P(A) 0.80" in listing and "logprobs unreadable" not in listing
    assert 'data-p-first="0.8' in battle and "could not be read" not in battle
    assert "1 verdicts read from the stored logprobs, 0 from the text" in judge


def test_a_loopback_app_answers_every_loopback_address_and_the_host_it_was_bound_by(demo_folder: Path) -> None:
    """Served on 127.0.0.2 (loopback), its URL answered 403: only 127.0.0.1, localhost and ::1 were (was)."""
    with Store(Settings(), root=demo_folder, readonly=True) as store:
        app = create_app(Browser(store), hosts=("my-box",))
        for base, status in [("http://127.0.0.2:8765", 200), ("http://127.1.2.3", 200), ("http://my-box:8765", 200),
                             ("http://LOCALHOST:8765", 200), ("http://other-box", 403),
                             ("http://127.0.0.2.evil.example", 403), ("http://10.0.0.1", 403)]:  # fmt: skip
            assert TestClient(app, base_url=base).get("/").status_code == status, base


def test_an_ipv4_loopback_address_written_as_ipv6_is_loopback() -> None:
    """--host ::ffff:127.0.0.1 was warned of as public, and the Host check was off on it (was)."""
    from store.browse.server import is_loopback

    assert is_loopback("::ffff:127.0.0.1") and is_loopback("[::ffff:127.0.0.2]") and is_loopback("::1")
    assert not is_loopback("::ffff:10.0.0.1") and not is_loopback("10.0.0.1")


def test_a_judgement_stored_without_model_a_shows_no_model_not_none(tmp_path: Path) -> None:
    """A pointwise judgement with model_a and judge NULL (an import, the ORM) printed "None" for each (was)."""
    rendered = render_messages([{"role": "user", "content": "Rate: 4"}])
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        store.database("judgements", demo.TASK, demo.descriptor(demo.JUDGE)).put_many(
            [
                JudgementRecord(
                    input_hash=input_hash(rendered),
                    input_text=rendered,
                    completion="8",
                    benchmark="b",
                    instruction_id="q1",
                    created_at=demo.T0,
                )
            ]
        )
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        rows = get(client, "/rows", role="judgements")
        (href,) = re.findall(r'class="row-link hash" href="([^"]+)"', rows)
        row = get(client, href.replace("&amp;", "&"))
    reader.close()
    assert '<span class="slot">A</span> (no model)' in rows and "> None" not in rows
    assert "A = (no model)" in row and "A = None" not in row
    assert "judge (no judge)" in row and "judge None" not in row  # as a battle says it


def test_a_completion_stored_without_a_model_is_shown_on_the_battle_its_row_links_to(tmp_path: Path) -> None:
    """The rows page linked such a row to its battle, which left it out: a 404 when no other model answered (was)."""
    question = [{"role": "user", "content": "Anyone there?"}]
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        store.database("completions", demo.TASK, demo.descriptor("tiny-a")).put_many(
            [dataclasses.replace(demo.completion("tiny-a", "q1", question, "Nobody knows who says this.", 0),
                                 model=None)]
        )  # fmt: skip
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        (href,) = re.findall(r'class="battle-link" href="([^"]+)"', get(client, "/rows"))
        battle = get(client, href.replace("&amp;", "&"))
    reader.close()
    assert '<b class="model">(no model)</b>' in battle and "Nobody knows who says this." in battle
    assert 'class="row-link"' in battle
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:  # four models answer too: they come first
        for model in ("m1", "m2", "m3", "m4"):
            store.database("completions", demo.TASK, demo.descriptor(model)).put_many(
                [demo.completion(model, "q1", question, f"{model} is here.", 1)]
            )
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        crowded = get(client, href.replace("&amp;", "&"))
    reader.close()
    assert all(f"{model} is here." in crowded for model in ("m1", "m2", "m3", "m4")) and "(no model)" not in crowded


def test_a_battle_of_an_instruction_with_only_later_samples_shows_the_lowest(tmp_path: Path) -> None:
    """The rows page linked sample 1's row to its battle, which kept sample 0 only: a 404 "no row of instruction"
    (was). Sample 0 is still the one shown where it is stored."""
    question = [{"role": "user", "content": "Name a colour."}]
    rendered = render_messages(question)

    def sample(k: int, text: str) -> Any:
        return dataclasses.replace(demo.completion("tiny-a", "q1", question, text, k), sample_index=k,
                                   input_hash=input_hash(rendered, k))  # fmt: skip

    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        store.database("completions", demo.TASK, demo.descriptor("tiny-a")).put_many(
            [sample(2, "teal, the second"), sample(1, "red, the first")]
        )
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        href = re.findall(r'class="battle-link" href="([^"]+)"', get(client, "/rows"))[0].replace("&amp;", "&")
        battle = get(client, href)
        with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
            store.database("completions", demo.TASK, demo.descriptor("tiny-a")).put_many([sample(0, "blue, at last")])
        again = get(client, href)
    reader.close()
    assert "red, the first" in battle and "teal" not in battle
    assert "blue, at last" in again and "red, the first" not in again


def test_a_model_answering_under_two_settings_shows_the_answer_its_judges_saw_and_says_there_is_another(
    demo_folder: Path, tmp_path: Path
) -> None:
    """The battle showed whichever of a model's databases came first (by descriptor hash) beside verdicts on the
    other's answer, without a word (was): the answer a judgement quotes is shown, and the page counts the rest."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    judged = demo.descriptor("tiny-a")
    # Settings whose folder comes before the judged one's: the order the databases are found in no longer decides.
    other = min((demo.descriptor("tiny-a", temperature=t / 10) for t in range(1, 10)), key=lambda d: d.sha256())
    assert other.sha256() < judged.sha256()
    question = [{"role": "user", "content": demo.QUESTIONS["00-writing"]}]
    with Store(Settings(), root=root) as store:
        store.database("completions", demo.TASK, other).put_many(
            [demo.completion("tiny-a", "00-writing", question, "An answer no judge saw.", 0)]
        )
    reader = Store(Settings(), root=root, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        battle = get(client, "/battle", benchmark=demo.BENCH, instruction_id="00-writing")
        alone = get(client, "/battle", benchmark=demo.BENCH, instruction_id="01-coding")
    reader.close()
    card = battle.split('data-model="tiny-a"')[1].split("</article>")[0]
    assert "The keeper found a <strong>bottle</strong>" in card and "An answer no judge saw." not in card
    assert "answered this instruction in 2 databases" in card and "the answer its judges were shown" in card
    assert "model=tiny-a" in card  # the link to every answer of the model
    assert "answered this instruction in" not in alone  # one database, one answer: nothing to say


@pytest.mark.parametrize("kind", ["a prefix of the judged answer", "the other model's answer"])
def test_an_other_settings_answer_a_judge_prompt_also_holds_is_not_taken_for_the_judged_one(
    demo_folder: Path, tmp_path: Path, kind: str
) -> None:
    """A plain substring test took an answer cut short (a prefix of the judged one) or one equal to the other
    model's answer, both in the judge's prompt, for the answer the judges were shown, and said so (was)."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    judged = demo.descriptor("tiny-a")
    other = min((demo.descriptor("tiny-a", max_tokens=t) for t in range(2, 20)), key=lambda d: d.sha256())
    assert other.sha256() < judged.sha256()  # found first
    full = demo.answer_of("00-writing", "tiny-a")
    text = full[:18] if kind == "a prefix of the judged answer" else demo.answer_of("00-writing", "tiny-b")
    question = [{"role": "user", "content": demo.QUESTIONS["00-writing"]}]
    with Store(Settings(), root=root) as store:
        store.database("completions", demo.TASK, other).put_many(
            [demo.completion("tiny-a", "00-writing", question, text, 0)]
        )
    reader = Store(Settings(), root=root, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        battle = get(client, "/battle", benchmark=demo.BENCH, instruction_id="00-writing")
    reader.close()
    card = battle.split('data-model="tiny-a"')[1].split("</article>")[0]
    assert "answered this instruction in 2 databases" in card
    if kind == "a prefix of the judged answer":  # the longest answer in the prompt: the judged one, said so
        assert "<strong>bottle</strong>" in card and "the answer its judges were shown" in card
    else:  # two answers of tiny-a are in the prompt: it cannot tell which the judges saw, and does not say
        assert "the answer its judges were shown" not in card and "one of them" in card


def test_the_every_answer_link_of_completions_without_a_model_lists_them(tmp_path: Path) -> None:
    """Its link filtered on the model "(no model)", which no row has: an empty list (was). No filter takes the rows
    without a model alone: the link lists the instruction's answers, and says so."""
    question = [{"role": "user", "content": "Anyone there?"}]
    with Store(Settings(store_root=tmp_path), root=tmp_path) as store:
        for settings in ({}, {"max_tokens": 9}):
            store.database("completions", demo.TASK, demo.descriptor("tiny-a", **settings)).put_many(
                [dataclasses.replace(demo.completion("tiny-a", "q1", question, f"Nobody {settings}", 0), model=None)]
            )
    reader = Store(Settings(store_root=tmp_path), root=tmp_path, readonly=True)
    with TestClient(create_app(Browser(reader)), base_url=LOCAL) as client:
        battle = get(client, "/battle", benchmark=demo.BENCH, instruction_id="q1")
        (href,) = re.findall(r'href="([^"]+)">every answer to this instruction</a>', battle)
        listing = get(client, href.replace("&amp;", "&"))
    reader.close()
    assert "model=" not in href and listing.count('class="row-link hash"') == 2


def test_the_judge_pages_name_a_judgements_database_that_cannot_be_read(demo_folder: Path, tmp_path: Path) -> None:
    """With the judge's only database damaged, /judges listed no judge and said nothing, and the judge's page was a
    404 "no judgement by judge" that dropped the error (was); the other pages name the databases they skip."""
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    judge_db = next(root.glob("judgements/*/*/*/*/judgements.db"))
    judge_db.write_bytes(b"this is not a database" * 100)
    name = judge_db.parent.relative_to(root).as_posix()
    with (
        Store(Settings(), root=root, readonly=True) as store,
        TestClient(create_app(Browser(store)), base_url=LOCAL) as c,
    ):
        judges = get(c, "/judges")
        judge = get(c, "/judges", judge=demo.JUDGE)
    for html in (judges, judge):
        assert f"Skipped {name}: " in html and "is not an SQLite database" in html
    assert "No judgements in" in judges and "outside the databases skipped" in judges
    assert "it may have some in those skipped" in judge


def test_the_rows_page_says_its_end_date_is_exclusive_as_the_command_lines_until(client: TestClient) -> None:
    """until=2026-03-01 leaves out that day's rows (created_at < its midnight, as --until), under a label "Until"
    that said nothing of it (was)."""
    assert demo.T0.date().isoformat() == "2026-03-01"
    html = " ".join(get(client, "/rows", until="2026-03-01").split())
    assert "No rows match." in html  # every demo row is of 2026-03-01: none is before it
    assert 'so that day is left out (as --until)">Before <input name="until" value="2026-03-01"' in html
    assert "No rows match." not in get(client, "/rows", until="2026-03-02")


def test_a_filtered_page_reads_only_the_databases_that_may_hold_its_rows(demo_folder: Path, tmp_path: Path) -> None:
    """Every page opened and queried every database (was): about 2 ms each, 5 s for a model's rows among 2,000
    databases. Those the store's catalog rules out are left unopened; one it cannot tell about is still read, and
    skipped with its error."""
    with (
        Store(Settings(), root=demo_folder, readonly=True) as store,
        TestClient(create_app(Browser(store)), base_url=LOCAL) as c,
    ):
        page = " ".join(get(c, "/rows", model="tiny-b", limit=500).split())
        everything = get(c, "/rows", limit=500)
    # tiny-b's completions and the judgements naming it: neither tiny-a database
    assert "2 databases read." in page and "4 databases read." in " ".join(everything.split())
    assert page.count('class="row-link hash"') == sum(
        ('data-role="completions"' in row and "tiny-b" in row) or 'data-role="judgements"' in row
        for row in everything.split("<tr ")[1:]
    )
    root = tmp_path / "store"
    shutil.copytree(demo_folder, root)
    next(root.glob("judgements/*/*/*/*/judgements.db")).write_bytes(b"this is not a database" * 100)
    with (
        Store(Settings(), root=root, readonly=True) as store,
        TestClient(create_app(Browser(store)), base_url=LOCAL) as c,
    ):
        assert "Skipped judgements/" in get(c, "/rows", model="tiny-b")


def test_a_query_whose_escapes_are_no_utf8_text_is_a_bad_request(client: TestClient) -> None:
    """`/rows?model=%ff%fe` was read as U+FFFD and answered "No rows match", 200 (was)."""
    for query in ("model=%ff%fe", "q=%ed%a0%80", "judge=ok&benchmark=caf%e9"):
        response = client.get(f"/rows?{query}")
        assert response.status_code == 400 and "is not UTF-8 text" in response.text, query
    assert client.get("/rows?q=%25%20caf%C3%A9").status_code == 200  # "% café": escapes of UTF-8 text
