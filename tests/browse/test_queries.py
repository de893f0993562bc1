"""The rows page's reads on both backends: keyset pages across databases, bounded scans, filters, search.

Every way through the pages (newest or oldest first, filtered by an indexed
column or a scanned one, searched, with windows and probes made tiny so that
each path is taken) must list exactly the rows the store's own query finds,
each once, in order.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import event, select

from store import ModelDescriptor, RowFilter, Selector, Store
from store.backends.sqlite import rows as sqlite_rows
from store.browse import browser as browser_module
from store.browse import queries
from store.browse.browser import Browser
from store.browse.pages import RowsQuery, database_name
from store.browse.queries import Key
from store.descriptor import input_hash, render_messages, render_text
from store.settings import Settings
from tests.factories import completion_record, judgement_record

T0 = datetime(2026, 5, 1, tzinfo=UTC)


def _stamp(i: int) -> datetime:
    return T0 + timedelta(minutes=i // 5)  # five rows to an instant: ties within and across databases


def fill(store: Store) -> None:
    for model in ("qwen", "llama"):
        rows = [
            completion_record(i, model=model, benchmark="mt-bench" if i % 3 else "arena", created_at=_stamp(i),
                              finish_reason="length" if i % 4 == 0 else "stop",
                              completion=f"Answer {i} about a LightHouse" if i % 7 == 0 else f"answer {i}")
            for i in range(37)
        ]  # fmt: skip
        rows.append(completion_record(99, model=model, benchmark=None, created_at=_stamp(3), instruction_id="5"))
        store.database("completions", "t", ModelDescriptor(provider="vllm", model=model)).put_many(rows)
    judged = [
        judgement_record(i, orientation=o, created_at=_stamp(i), model_a=a, model_b=b)
        for i in range(20)
        for o, a, b in (("direct", "qwen", "llama"), ("reversed", "llama", "qwen"))
    ]
    store.database("judgements", "t", ModelDescriptor(provider="vllm", model="judge-1")).put_many(judged)


@pytest.fixture(params=["folder", pytest.param("server", marks=pytest.mark.postgres)])
def paged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "folder":
        root = tmp_path / "paged"
        with Store(Settings(), root=root) as writer:
            fill(writer)
        store = Store(Settings(), root=root, readonly=True)
    else:
        url = request.getfixturevalue("pg_url")
        with Store(Settings(), url=url) as writer:
            fill(writer)
        store = Store(Settings(), url=url, readonly=True)
    with store:
        yield store


def expected(store: Store, flt: RowFilter, order: str = "newest", search: str | None = None) -> list[Key]:
    """The rows a listing must show; a search as the contract says (the prompt's text, the completion)."""
    keys = [
        Key(found.record.created_at, database_name(found.location), found.record.input_hash)
        for found in store.query_rows(Selector(), flt)
        if search is None
        or any(
            search.lower() in said.lower() for said in [*prompt_says(found.record.input_text), found.record.completion]
        )
    ]
    return sorted(keys, reverse=order == "newest")


def prompt_says(rendered: str) -> list[str]:
    """What a rendered prompt says: its messages' contents or its text (never its JSON's keys), one by one."""
    value = orjson.loads(rendered)
    return [m["content"] for m in value["messages"]] if "messages" in value else [value["text"]]


def walk(browser: Browser, query: RowsQuery) -> tuple[list[Key], int]:
    """Every row the pages list, following "next" to the end; and how many requests that took."""
    seen: list[Key] = []
    requests = 0
    while True:
        page = browser.rows(query)
        requests += 1
        assert len(page.rows) <= query.limit
        seen += [row.key for row in page.rows]
        if page.next is None:
            return seen, requests
        assert requests < 500
        query = dataclasses.replace(query, after=page.next)


@pytest.mark.parametrize("order", ["newest", "oldest"])
def test_keyset_pages_list_every_row_once_in_order_across_databases(paged: Store, order: str) -> None:
    browser = Browser(paged)
    seen, requests = walk(browser, RowsQuery(order=order, limit=7))  # type: ignore[arg-type]
    assert seen == expected(paged, RowFilter(), order)
    assert len(seen) == 2 * 38 + 40 and len(set(seen)) == len(seen)
    assert requests == -(-len(seen) // 7)


@pytest.mark.parametrize(
    ("flt", "search"),
    [
        (RowFilter(orientation="direct"), None),
        (RowFilter(finish_reasons=("length",)), None),
        (RowFilter(), "lighthouse"),  # ASCII case ignored on both backends
        (RowFilter(model="qwen", finish_reasons=("length",)), "answer"),
    ],
    ids=["orientation", "finish-reason", "search", "indexed-and-scanned"],
)
def test_scanned_filters_and_search_go_window_by_window_and_miss_nothing(
    paged: Store, monkeypatch: pytest.MonkeyPatch, flt: RowFilter, search: str | None
) -> None:
    monkeypatch.setattr(queries, "SCAN_WINDOW", 4)
    monkeypatch.setattr(browser_module, "SCAN_SECONDS", 0)  # one window per request
    browser = Browser(paged)
    seen, requests = walk(browser, RowsQuery(flt=flt, search=search, limit=3))
    assert seen == expected(paged, flt, search=search)
    assert seen and requests > len(seen) / 3  # some requests ended where a window did, not after a full page


@pytest.mark.parametrize("word", ["content", "role", "user", "messages"])
def test_a_search_for_a_word_of_the_prompts_json_pages_through_every_row_and_finds_none(
    paged: Store, monkeypatch: pytest.MonkeyPatch, word: str
) -> None:
    monkeypatch.setattr(queries, "SCAN_WINDOW", 16)
    monkeypatch.setattr(browser_module, "SCAN_SECONDS", 0)  # one window per request
    seen, requests = walk(Browser(paged), RowsQuery(search=word, limit=3))
    assert seen == [] == expected(paged, RowFilter(), search=word)
    assert requests > 1  # it read window after window to the end


def test_a_page_that_ends_where_a_scan_window_does_says_how_far_it_read(
    paged: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "SCAN_WINDOW", 4)
    monkeypatch.setattr(browser_module, "SCAN_SECONDS", 0)
    page = Browser(paged).rows(RowsQuery(search="LIGHTHOUSE", limit=50))
    assert page.scanned_to is not None and page.next == page.scanned_to
    assert all(row.key >= page.scanned_to for row in page.rows)


def test_a_page_reads_window_after_window_while_it_has_room_and_time(
    paged: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "SCAN_WINDOW", 4)
    monkeypatch.setattr(browser_module, "SCAN_SECONDS", 60)
    page = Browser(paged).rows(RowsQuery(search="LIGHTHOUSE", limit=50))  # 116 rows: 29 windows of 4
    assert [row.key for row in page.rows] == expected(paged, RowFilter(), search="lighthouse")
    assert page.next is None and page.scanned_to is None
    full = Browser(paged).rows(RowsQuery(flt=RowFilter(orientation="reversed"), limit=5))
    assert [row.key for row in full.rows] == expected(paged, RowFilter(orientation="reversed"))[:5]
    assert full.next is not None and full.next <= full.rows[-1].key  # the next page goes on from here


def test_an_unselective_indexed_filter_is_read_in_time_order_on_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(PostgreSQL's planner chooses from its statistics: nothing is rewritten there.)"""
    with Store(Settings(), root=tmp_path / "s") as writer:
        fill(writer)
    statements: list[str] = []
    with Store(Settings(), root=tmp_path / "s", readonly=True) as store:
        for location in store.locations():
            event.listen(store.open(location).engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        browser = Browser(store)
        flt = RowFilter(model="qwen")
        listed = walk(browser, RowsQuery(flt=flt, limit=10))[0]
        assert not any("IS 1" in s for s in statements)  # 78 rows match: fewer than the probe's 2,000
        monkeypatch.setattr(sqlite_rows, "LISTING_PROBE_ROWS", 5)
        statements.clear()
        assert walk(browser, RowsQuery(flt=flt, limit=10))[0] == listed == expected(store, flt)
        assert any("IS 1" in s for s in statements)


def test_an_instruction_id_alone_is_found_under_every_benchmark_and_none(paged: Store) -> None:
    flt = RowFilter(instruction_id="5")
    page = Browser(paged).rows(RowsQuery(flt=flt))
    found = {(row.location.role, row.benchmark) for row in page.rows}
    assert [row.key for row in page.rows] == expected(paged, flt)
    assert (
        ("completions", "mt-bench") in found
        and ("completions", None) in found
        and ("judgements", "arena-hard") in found
    )


def test_filters_choose_databases_by_role_and_task(paged: Store) -> None:
    browser = Browser(paged)
    judged = browser.rows(RowsQuery(flt=RowFilter(judge="judge-1"), limit=100))
    assert {row.location.role for row in judged.rows} == {"judgements"} and len(judged.rows) == 40
    assert judged.databases == 1
    assert browser.rows(RowsQuery(selector=Selector(task="other"))).rows == []
    one = browser.rows(RowsQuery(database=database_name(paged.locations()[0]), limit=100))
    assert {database_name(row.location) for row in one.rows} == {database_name(paged.locations()[0])}


def test_a_cursor_this_browser_did_not_make_is_refused_by_name() -> None:
    key = Key(T0, "completions/t/vllm/qwen/0123456789abcdef", "ab" * 32)
    assert Key.from_token(key.token()) == key
    for bad in ("garbage!", Key(T0, "x", "y").token()[:-4], "bnVsbA"):
        with pytest.raises(Exception, match="cursor"):
            Key.from_token(bad)


# Answers holding U+0000 (a server keeps it as U+FDD0 "0"), the server's escape character (kept as U+FDD0 "1"),
# and letters outside ASCII; prompts that hold none of the needles below ({"text":"§§","type":"text"}).
ODD_ANSWERS = ["k\x00w", "\ufdd0z", "plain", "é", "Éa", "A\x00b0", "q.(r)*|s"]


@pytest.mark.parametrize(
    ("needle", "found"),
    [
        ("0", ["A\x00b0"]),  # not the "0" a server's escaped U+0000 ends with
        ("1", []),
        ("\x00", ["k\x00w", "A\x00b0"]),
        ("w", ["k\x00w"]),  # after a U+0000: SQLite's LIKE stops there
        ("\x00B", ["A\x00b0"]),
        ("Z", ["\ufdd0z"]),  # ASCII letters in any case
        ("\ufdd0", ["\ufdd0z"]),
        ("É", ["Éa"]),  # other letters as they are
        ("é", ["é"]),
        ("a", ["plain", "Éa", "A\x00b0"]),
        ("Q.(R)*|", ["q.(r)*|s"]),  # punctuation is text, not pattern syntax (as a pattern it would match all)
    ],
)
def test_a_search_finds_the_same_rows_on_both_backends(
    request: pytest.FixtureRequest, tmp_path: Path, needle: str, found: list[str]
) -> None:
    prompts = [render_text("§" * (i + 1)) for i in range(len(ODD_ANSWERS))]
    matched = searched(request, tmp_path, list(zip(prompts, ODD_ANSWERS, strict=True)), needle)
    assert matched == {backend: sorted(ODD_ANSWERS.index(a) for a in found) for backend in ("folder", "server")}


def searched(request: pytest.FixtureRequest, tmp_path: Path, rows: list[tuple[str, str]], needle: str) -> Any:
    """Which of ``rows`` (rendered prompt, completion) a search for ``needle`` matches, by index, per backend."""
    matched = {}
    for backend in ("folder", "server"):
        where = {"root": tmp_path / "odd"} if backend == "folder" else {"url": request.getfixturevalue("pg_url")}
        with Store(Settings(), **where) as store:  # type: ignore[arg-type]
            database = store.database("completions", "t", ModelDescriptor(provider="vllm", model="odd"))
            keys = [input_hash(prompt) for prompt, _ in rows]
            database.put_many(
                completion_record(i, input_text=prompt, input_hash=key, completion=completion)
                for i, ((prompt, completion), key) in enumerate(zip(rows, keys, strict=True))
            )
            with database.reading() as repo:
                found = repo.conn.execute(select(repo.table.c.input_hash).where(repo.contains_text(needle)))
                matched[backend] = sorted(keys.index(key) for key in found.scalars())
    return matched


ODD_PROMPTS = ['say "hi"', "back\\slash", "line1\nline2", "k\x00w", "\ufdd0z", "tab\there", "plain é"]


@pytest.mark.parametrize(
    ("needle", "found"),
    [
        ('say "HI"', ['say "hi"']),  # a quote: stored escaped in the prompt's JSON, found as the prompt says it
        ('"', ['say "hi"']),  # never the JSON's own quotes
        ("\\", ["back\\slash"]),  # never the backslash of an escape
        ("back\\slash", ["back\\slash"]),
        ("\n", ["line1\nline2"]),
        ("line1\nline2", ["line1\nline2"]),
        ("\x00", ["k\x00w"]),
        ("\x00W", ["k\x00w"]),
        ("\ufdd0", ["\ufdd0z"]),
        ("\t", ["tab\there"]),
        ("n é", ["plain é"]),
    ],
)
def test_a_search_finds_what_a_prompt_says_on_both_backends(
    request: pytest.FixtureRequest, tmp_path: Path, needle: str, found: list[str]
) -> None:
    """The prompt is stored as JSON: a quote, a backslash, a newline, U+0000 in it are found as written."""
    rows = [(render_messages([{"role": "user", "content": text}]), f"answer {i}") for i, text in enumerate(ODD_PROMPTS)]
    matched = searched(request, tmp_path, rows, needle)
    assert matched == {backend: sorted(ODD_PROMPTS.index(p) for p in found) for backend in ("folder", "server")}


SAID = {
    "box": render_messages([{"role": "user", "content": "What is the CONTENT of the box?"}]),
    "system": render_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]),
    "text": render_text("a text prompt"),
    "nul": render_text("a\x00b said"),
    "raw": "the content type of a raw prompt",  # not JSON: text another tool stored
    "cut": '{"messages":[{"content":"cut short',  # begins as a rendered input, and is none
    "percent": render_messages([{"role": "user", "content": "100% sure"}]),
    "underscore": render_messages([{"role": "user", "content": "snake_case"}]),
    "excellent": render_messages([{"role": "user", "content": "excellent 1 more"}]),
    "lines": render_messages([{"role": "user", "content": "line1\nline2"}]),
    "backslash": render_messages([{"role": "user", "content": "ends with \\"}, {"role": "assistant", "content": "x"}]),
}


@pytest.mark.parametrize(
    ("needle", "found"),
    [
        ("content", ["box", "raw", "cut"]),  # said in a message, or in a text that is not a rendered input
        ("role", []),  # the rendered input's keys and their values are not what it says
        ("USER", []),
        ("system", []),
        ("assistant", []),
        ("type", ["raw"]),
        ("text", ["text"]),
        ("be brief", ["system"]),  # every message, the system prompt too
        ("hello", ["system"]),
        ("\x00B", ["nul"]),
        ("cut short", ["cut"]),
        ("messages", ["cut"]),
        ("%", ["percent"]),  # % and _ are text, not LIKE's wildcards
        ("1%e", []),
        ("_", ["underscore"]),
        ("e_c", ["underscore"]),
        ("nline", []),  # not the "n" of the JSON's "\n"
        ('"', ["cut"]),  # not the JSON's closing quote after an escaped backslash
    ],
)
def test_a_search_finds_what_a_prompt_says_not_its_json_on_both_backends(
    request: pytest.FixtureRequest, tmp_path: Path, needle: str, found: list[str]
) -> None:
    names = list(SAID)
    matched = searched(request, tmp_path, [(SAID[name], f"answer {i}") for i, name in enumerate(names)], needle)
    assert matched == {backend: sorted(names.index(name) for name in found) for backend in ("folder", "server")}


def test_a_search_reads_a_prompt_that_only_begins_and_ends_as_a_rendered_one(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Text that is not JSON, framed as a rendered input: the statement still runs, and finds what it says."""
    fake = '{"messages":[{"content":"not json" "}],"type":"messages"}'
    matched = searched(request, tmp_path, [(fake, "answer"), (SAID["box"], "answer")], "NOT JSON")
    assert matched == {"folder": [0], "server": [0]}


SAYS_NUL_ESCAPE = {
    "code": render_messages([{"role": "user", "content": 'puts("\\u0000");\nline two'}]),  # says \u0000, holds none
    "text": render_text("C:\\\\u0000\tdir"),  # two backslashes said, then u0000
    "nul": render_text("a\\\x00\nline"),  # a backslash, then a U+0000: its JSON spells \\\u0000
    "fdd0": render_text("\ufdd0 and \x00"),
}


@pytest.mark.parametrize(
    ("needle", "found"),
    [
        ("nline", []),  # never the "n" of a "\n", in a prompt holding U+0000 too
        ("tdir", []),
        ("u0", ["code", "text"]),  # never the "u" of an escape \u0000
        ("\\u0000", ["code", "text"]),
        ('\\u0000");\nLINE', ["code"]),
        ("\\\x00", ["nul"]),
        ("\x00\nline", ["nul"]),
        (" and \x00", ["fdd0"]),
    ],
)
def test_a_prompt_holding_u0000_or_saying_backslash_u0000_is_read_as_it_decodes_on_both_backends(
    request: pytest.FixtureRequest, tmp_path: Path, needle: str, found: list[str]
) -> None:
    """SQLite's JSON functions stop at a U+0000: a prompt that holds one is still read for what it says, never for
    its JSON's spelling; one that says the six characters \\u0000 holds none and is read as every other one."""
    names = list(SAYS_NUL_ESCAPE)
    rows = [(SAYS_NUL_ESCAPE[name], f"answer {i}") for i, name in enumerate(names)]
    expected = sorted(names.index(name) for name in found)
    assert searched(request, tmp_path, rows, needle) == {"folder": expected, "server": expected}


def test_in_a_prompt_holding_u0000_sqlite_reads_u0000_and_ufdd0_as_one(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The one difference between the backends (Repository.contains_text), about a noncharacter, never assigned;
    only where the prompt's JSON holds the search text too (here in a role), which the search reads first."""
    rows = [
        (render_messages([{"role": "\x00 and", "content": "\ufdd0 and"}]), "answer 0"),
        (render_messages([{"role": "user", "content": "\ufdd0 and"}]), "answer 1"),
    ]
    assert searched(request, tmp_path, rows, "\x00 AND") == {"folder": [0], "server": []}
    assert searched(request, tmp_path, rows, "\ufdd0 AND") == {"folder": [0, 1], "server": [0, 1]}


def test_both_backends_find_what_a_python_reader_of_the_prompts_finds_on_random_text(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Random prompts built of the characters and words the search's readers treat apart (quotes, backslashes, the
    letters of escapes, U+FDD0, the JSON's own keys, non-ASCII case), searched for random needles: both backends
    match exactly the rows whose messages (or text) or completion hold the needle, ASCII letters in any case; in a
    prompt holding U+0000, SQLite reads U+0000 and U+FDD0 as one (see contains_text)."""
    pieces = ["a", "A", "n", "t", "u", "0", '"', "\\", "\n", "\t", "\ufdd0", "é", "É", "😀", ":", "}", ",", " ",
              "content", '"content":"', "role", "\\u0000", '"}],"type":"messages"}']  # fmt: skip
    rng = random.Random(20261204)

    def said(most: int, *, nul: bool = False) -> str:
        return "".join(rng.choice([*pieces, "\x00"] if nul else pieces) for _ in range(rng.randint(0, most)))

    rows: dict[str, str] = {}
    while len(rows) < 80:
        if rng.random() < 0.7:
            chat = [{"role": said(3, nul=True), "content": said(8, nul=True)} for _ in range(rng.randint(1, 3))]
            rows.setdefault(render_messages(chat), said(4, nul=True))
        else:
            rows.setdefault(render_text(said(8, nul=True)), said(4, nul=True))
    needles = sorted({said(3, nul=True) for _ in range(120)} - {""})

    def ascii_lower(text: str) -> str:
        return "".join(c.lower() if c.isascii() else c for c in text)

    def oracle(prompt: str, completion: str, needle: str, *, stand_in: bool = False) -> bool:
        says = [*prompt_says(prompt)]
        if stand_in and "\\u0000" in prompt.replace("\\\\", ""):  # the prompt holds U+0000: SQLite's reading
            says, needle = [text.replace("\x00", "\ufdd0") for text in says], needle.replace("\x00", "\ufdd0")
        return any(ascii_lower(needle) in ascii_lower(text) for text in [*says, completion])

    keys = [input_hash(prompt) for prompt in rows]
    table = [(prompt, completion, key) for (prompt, completion), key in zip(rows.items(), keys, strict=True)]
    for backend in ("folder", "server"):
        where = {"root": tmp_path / "odd"} if backend == "folder" else {"url": request.getfixturevalue("pg_url")}
        with Store(Settings(), **where) as store:  # type: ignore[arg-type]
            database = store.database("completions", "t", ModelDescriptor(provider="vllm", model="odd"))
            database.put_many(
                completion_record(i, input_text=prompt, input_hash=key, completion=completion)
                for i, ((prompt, completion), key) in enumerate(zip(rows.items(), keys, strict=True))
            )
            with database.reading() as repo:
                for needle in needles:
                    found = repo.conn.execute(select(repo.table.c.input_hash).where(repo.contains_text(needle)))
                    exact = {key for prompt, completion, key in table if oracle(prompt, completion, needle)}
                    if backend == "server":
                        assert set(found.scalars()) == exact, needle
                    else:  # what the prompts say, or their U+0000 read as U+FDD0 with the search text's
                        stand_in = {k for p, c, k in table if oracle(p, c, needle, stand_in=True)}
                        assert exact <= set(found.scalars()) <= stand_in, needle


# U+0000 early, late and beyond the prefix, with characters of 2 and 4 bytes: SQLite's substr and length stop at
# the first U+0000 (the listing showed "k", and no ellipsis).
NUL_ANSWERS = ["k\x00w", "\x00" * 1000, "é\x00" + "é" * 900, "x\x00" + "😀" * 1000, "no nul " + "é" * 500]


def test_a_listed_completion_holding_nul_reads_its_prefix_on_both_backends(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    prefix = queries.COMPLETION_PREFIX
    for backend in ("folder", "server"):
        where = {"root": tmp_path / "nul"} if backend == "folder" else {"url": request.getfixturevalue("pg_url")}
        with Store(Settings(), **where) as store:  # type: ignore[arg-type]
            database = store.database("completions", "t", ModelDescriptor(provider="vllm", model="nul"))
            database.put_many(completion_record(i, completion=text) for i, text in enumerate(NUL_ANSWERS))
            listed = queries.page(database, "nul", RowFilter(), limit=10).rows
        by_text = {row.completion: row.completion_chars for row in listed}
        assert sorted(by_text) == sorted(text[:prefix] for text in NUL_ANSWERS), backend
        for text in NUL_ANSWERS:
            chars = by_text[text[:prefix]]
            # exact, or (a SQLite text holding U+0000 beyond what was read) a bound that still says "more"
            assert chars == len(text) or prefix < chars <= len(text), (backend, text[:8], chars)


@pytest.mark.parametrize("order", ["newest", "oldest"])
@pytest.mark.parametrize("spans", ["apart", "overlapping"])
def test_a_rows_page_of_many_databases_reads_those_that_hold_its_rows(tmp_path: Path, order: str, spans: str) -> None:
    """A rows page read every database (was): 2,000 databases, 4 s a page. Databases whose rows' times cannot reach
    the page are left unopened; following the cursors still lists every row once, in order."""
    start = datetime(2026, 5, 1, tzinfo=UTC)
    with Store(Settings(), root=tmp_path) as store:
        for i in range(30):  # database i: minutes 2i and 2i + 1 (apart), or i and i + 30 (each span overlapping)
            minutes = (2 * i, 2 * i + 1) if spans == "apart" else (i, i + 30)
            rows = [completion_record(100 * i + k, model=f"m{i:02d}", created_at=start + timedelta(minutes=minute))
                    for k, minute in enumerate(minutes)]  # fmt: skip
            store.database("completions", "t", ModelDescriptor(provider="vllm", model=f"m{i:02d}")).put_many(rows)
    listed: list[Any] = []
    read = []
    with Store(Settings(), root=tmp_path, readonly=True) as store:
        browser, after = Browser(store), None
        while True:
            page = browser.rows(RowsQuery(order=order, limit=5, after=after))  # type: ignore[arg-type]
            listed += page.rows
            read.append(page.databases)
            if page.next is None:
                break
            after = page.next
    times = [row.key.created_at for row in listed]
    assert len(listed) == 60 == len({row.key for row in listed})
    assert times == sorted(times, reverse=order == "newest")
    if spans == "apart":  # a page's 5 rows and the one after them lie in 3 or 4 of the 30 databases
        assert max(read) <= 4 and len(read) == 12
