"""What each page of the browser shows, read from a store opened read-only: plain values for the templates.

Contract:

* :class:`Browser` wraps a :class:`~store.Store` that was opened with
  ``readonly=True`` (it refuses any other) and answers one question per
  page: :meth:`~Browser.overview`, :meth:`~Browser.rows`,
  :meth:`~Browser.battle`, :meth:`~Browser.judges`, :meth:`~Browser.judge`,
  :meth:`~Browser.row`. Each returns frozen dataclasses; no ORM object or
  connection leaves this module. Statements are :mod:`store.browse.queries`'.
* Databases are named by their folder in the layout
  (``judgements/demo/vllm/tiny-judge/7216727f7e827b5c``: role, task,
  provider, model, descriptor), the same for a folder and a server store.
  The list is read again for every page, so databases created while the
  browser runs show up.
* A database that cannot be read (behind, foreign, damaged, a server error)
  never breaks a page: the overview shows its state and error, the other
  pages list it among the databases they skipped, with the error.
* A rows page reads the databases in the order of the span of their rows'
  times (:func:`~store.browse.queries.created_span`, kept in the store's
  catalog while a database is unchanged), and stops at the first whose span
  cannot reach the rows it already has: a page of a store of thousands of
  databases opens those that hold its rows (and the few whose spans overlap
  them), not every one.
* A rows page whose scan window (:mod:`store.browse.queries`) ended before
  the page was full reads the next window, as long as it started less than
  :data:`SCAN_SECONDS` ago: a rare word is found in fewer requests, and no
  request reads more than one window past that.
* One page at a time reads the store (a lock): the store's open databases
  are shared, and the browser serves one person.
* The overview's finish reasons need a full read of each table (no index
  holds them): it counts them by itself in databases of up to
  :data:`AUTO_COUNT_ROWS` rows, in larger ones when asked
  (``count_all``). What it reads of a database (those counts, its runs
  added up, its judgements per judge) is kept in the store's catalog
  (:meth:`~store.backend.Storage.remembered`) until the database changes, on
  either backend, so an overview of thousands of unchanged databases costs
  what listing them does, in this browser and the next.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from store.adoption import adoptions
from store.backend import Database
from store.browse import queries
from store.browse.pages import (
    Answer,
    Battle,
    DatabaseSummary,
    JudgeList,
    JudgeVerdicts,
    JudgeView,
    NotFoundError,
    Round,
    RowsPage,
    RowsQuery,
    RowView,
    Skipped,
    Verdict,
    database_name,
)
from store.browse.queries import JudgeRow, Key, Listed
from store.browse.render import Turn, messages
from store.browse.verdicts import (
    JudgedRow,
    favoured_model,
    judge_figures,
    read_verdict,
    source_pair,
)
from store.catalog import UNREADABLE, readable
from store.errors import InvalidInputError, JudgestoreError
from store.layout import Location, Selector, metadata_bytes
from store.logprobs import decode
from store.runs import run_totals
from store.stats import catalog_fields, from_catalog_fields
from store.store import Store
from store.tables.filters import RowFilter, roles_for
from store.tables.records import CompletionRecord, JudgementRecord, RunTotals

T = TypeVar("T")
SCAN_SECONDS = 0.1  # a rows page goes on to the next scan window while it has room and started less than this ago
AUTO_COUNT_ROWS = 100_000  # the overview counts finish reasons by itself in databases up to this size
JUDGE_ROWS = 5_000  # the newest rows of a judge its page adds up (about 0.5 s of decoding logprobs)
MAX_BATTLE_MODELS = 4  # models shown side by side when an instruction has no judgement
NO_MODEL = "(no model)"  # what a battle names the answers of completions stored without a model
_OVERVIEW = "browse overview"  # what the overview derives from a database, as the store's catalog names it
_SPAN = "created_at span"  # the oldest and newest times of a database's rows, as the store's catalog names it
_JUDGES = "browse judges"  # a judgements database's rows per judge, as the store's catalog names it
_FINISH_REASONS = "browse finish reasons"  # those of a database too large to count unasked, once asked


@dataclass
class _Source:
    """A database a rows page may read: its name, the span of its rows' times, and the database once opened."""

    location: Location
    name: str
    oldest: datetime
    newest: datetime
    database: Database | None = None

    def reaches(self, key: Key, newest_first: bool) -> bool:
        """Whether it may hold a row listed before ``key`` (a tie in time is decided by the database's name)."""
        return self.newest >= key.created_at if newest_first else self.oldest <= key.created_at

    def passed(self, cursor: Key, newest_first: bool) -> bool:
        """Whether every one of its rows is listed before ``cursor`` (a page after it has none of them)."""
        return self.oldest > cursor.created_at if newest_first else self.newest < cursor.created_at


def _or_unreadable(derive: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What ``derive()`` reads of a database for the store's catalog, or the error that stopped it as
    :data:`~store.catalog.UNREADABLE`: never kept (:func:`~store.catalog.readable`), read again next time."""
    try:
        return derive()
    except JudgestoreError as e:
        return {UNREADABLE: str(e)}


def _reasons_by_name(reasons: dict[str | None, int]) -> dict[str, int]:
    return {("null" if k is None else str(k)): n for k, n in reasons.items()}


# ---------------------------------------------------------------- overview


# ---------------------------------------------------------------- rows


# ---------------------------------------------------------------- a battle


# ---------------------------------------------------------------- a judge


# ---------------------------------------------------------------- a row


class Browser:
    """The pages' data, read from a read-only store (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        if not store.readonly:
            raise InvalidInputError("the browser reads a store opened read-only: Store(..., readonly=True)")
        self.store = store
        self._lock = threading.Lock()

    @property
    def where(self) -> str:
        return self.store.where

    def _locked(self, work: Callable[[], T]) -> T:
        with self._lock:
            return work()

    def _databases(
        self,
        selector: Selector,
        roles: tuple[str, ...],
        skipped: list[Skipped],
        only: str | None = None,
        filters: tuple[RowFilter, ...] = (),
    ) -> Iterator[tuple[str, Database]]:
        """The databases ``selector`` picks, of ``roles`` (``only``: that one); those that fail go to ``skipped``.

        With ``filters``, those that cannot hold a row any of them matches are left out unopened, as commands do
        (:meth:`~store.backend.Storage.narrowed`: a folder store's catalog, a server's statements; one it cannot
        tell about is kept, and opening it says what is wrong): a page filtered on a model of a store of thousands
        of databases reads that model's.
        """
        for location in self._chosen(selector, roles, only, filters):
            name = database_name(location)
            try:
                database = self.store.open_existing(location)
            except JudgestoreError as e:
                skipped.append(Skipped(name, str(e)))
                continue
            if database is not None:
                yield name, database

    def _chosen(
        self, selector: Selector, roles: tuple[str, ...], only: str | None, filters: tuple[RowFilter, ...]
    ) -> list[Location]:
        """The locations :meth:`_databases` opens, unopened."""
        chosen = [
            location
            for location in self.store.select(selector)
            if location.role in roles and (only is None or database_name(location) == only)
        ]
        if filters:
            kept = {location for flt in filters for location in self.store.storage.narrowed(chosen, flt)}
            chosen = [location for location in chosen if location in kept]
        return chosen

    def _location(self, name: str) -> Location:
        for location in self.store.locations():
            if database_name(location) == name:
                return location
        raise NotFoundError(f"no database {name} in {self.where}")

    # ------------------------------------------------------------ overview

    def overview(self, *, count_all: bool = False) -> list[DatabaseSummary]:
        """Every database: its state, rows, size, runs; finish reasons where known (see the module docstring)."""
        return self._locked(lambda: self._overview(count_all))

    def _overview(self, count_all: bool) -> list[DatabaseSummary]:
        infos = list(self.store.infos(self.store.locations()))
        rows = {info.location: info.rows or 0 for info in infos if info.state.value == "current"}
        derived = dict(
            self.store.storage.remembered(
                rows,
                f"{_OVERVIEW} {AUTO_COUNT_ROWS}",
                lambda location: self._derived(location, rows[location]),
                lasting=readable,
            )
        )
        summaries = []
        for info in infos:
            name = database_name(info.location)
            data = derived.get(info.location, {})
            error = info.error or data.get(UNREADABLE)
            reasons: dict[str, int] | None = data.get("reasons")
            runs = None if error or "runs" not in data else from_catalog_fields(RunTotals, data["runs"])
            if reasons is None and not error and info.location in rows:  # a database too large to count unasked
                try:
                    reasons = self._finish_reasons(info.location, count=count_all)
                except JudgestoreError as e:
                    error = str(e)
            summaries.append(
                DatabaseSummary(name, info.location, info.state.value, info.rows, info.size_bytes, reasons, runs, error)
            )
        return summaries

    def _derived(self, location: Location, rows: int) -> dict[str, Any]:
        """What the overview shows of a current database, as the store's catalog keeps it: its runs added up, and
        its rows per finish reason if it holds at most :data:`AUTO_COUNT_ROWS` rows (else None: not counted)."""

        def derive() -> dict[str, Any]:
            database = self.store.open(location)
            reasons = _reasons_by_name(queries.finish_reasons(database)) if rows <= AUTO_COUNT_ROWS else None
            return {"runs": catalog_fields(run_totals(database)), "reasons": reasons}

        return _or_unreadable(derive)

    def _finish_reasons(self, location: Location, *, count: bool) -> dict[str, int] | None:
        """Rows per finish reason of a database too large to count unasked: kept in the store's catalog from an
        earlier count while the database is unchanged (on either backend), else counted if asked (else None)."""

        def counted(location: Location) -> dict[str, Any]:
            if not count:
                return {}  # not kept: the next request that asks counts
            return _or_unreadable(
                lambda: {"reasons": _reasons_by_name(queries.finish_reasons(self.store.open(location)))}
            )

        ((_, data),) = self.store.storage.remembered(
            [location], _FINISH_REASONS, counted, lasting=lambda value: "reasons" in value
        )
        if UNREADABLE in data:
            raise JudgestoreError(data[UNREADABLE])
        reasons: dict[str, int] | None = data.get("reasons")
        return reasons

    # ------------------------------------------------------------ rows

    def rows(self, query: RowsQuery) -> RowsPage:
        return self._locked(lambda: self._rows(query))

    def _rows(self, query: RowsQuery) -> RowsPage:
        """Pages of one scan window each, joined while the page has room and :data:`SCAN_SECONDS` allow."""
        skipped: list[Skipped] = []
        if query.database is not None:
            self._location(query.database)  # one named that is not there is a 404, as on /row
        roles = roles_for(query.flt, query.selector.role)
        sources = self._sources(query, roles, skipped)
        read: set[str] = set()
        deadline = time.monotonic() + SCAN_SECONDS
        shown: list[Listed] = []
        while True:
            wanted = dataclasses.replace(query, limit=query.limit - len(shown))
            rows, following, frontier = self._window(sources, wanted, skipped, read)
            shown += rows
            if frontier is None or len(shown) >= query.limit or time.monotonic() > deadline:
                return RowsPage(shown, following, frontier, len(read), skipped)
            query = dataclasses.replace(query, after=frontier)

    def _sources(self, query: RowsQuery, roles: tuple[str, ...], skipped: list[Skipped]) -> list[_Source]:
        """The databases a rows page may read, unopened, with the span of their rows' times (the store's catalog
        keeps it while a database is unchanged), in the order their rows come in the listing."""
        chosen = self._chosen(query.selector, roles, query.database, (query.flt,))
        sources = []
        for location, data in self.store.storage.remembered(chosen, _SPAN, self._span, lasting=readable):
            if UNREADABLE in data:
                skipped.append(Skipped(database_name(location), data[UNREADABLE]))
            elif data["span"] is not None:  # a database without rows has none to list
                oldest, newest = (datetime.fromisoformat(t) for t in data["span"])
                sources.append(_Source(location, database_name(location), oldest, newest))
        newest_first = query.order == "newest"
        sources.sort(key=lambda s: s.newest if newest_first else s.oldest, reverse=newest_first)
        return sources

    def _span(self, location: Location) -> dict[str, Any]:
        """The span of a database's rows' times, as the store's catalog keeps it (None: no row)."""

        def derive() -> dict[str, Any]:
            database = self.store.open_existing(location)
            span = None if database is None else queries.created_span(database)
            return {"span": None if span is None else [t.isoformat() for t in span]}

        return _or_unreadable(derive)

    def _window(
        self, sources: list[_Source], query: RowsQuery, skipped: list[Skipped], read: set[str]
    ) -> tuple[list[Listed], Key | None, Key | None]:
        """One page of at most one scan window per database: its rows, the next cursor, and where the scan ended.

        The databases are read in the order of their spans, until one's span cannot reach the rows already read:
        a page of a store of thousands of databases reads those that hold its rows.
        """
        newest = query.order == "newest"
        slices = []
        merged: list[Listed] = []  # the rows read, in listing order: at most one more than the page shows
        for source in sources:
            if len(merged) > query.limit and not source.reaches(merged[-1].key, newest):
                break  # neither it nor any database after it holds a row listed before the page's end
            if query.after is not None and source.passed(query.after, newest):
                continue  # its rows are all listed before the cursor
            if any(s.name == source.name for s in skipped):
                continue
            try:
                if source.database is None:
                    source.database = self.store.open_existing(source.location)
                if source.database is None:
                    continue
                part = queries.page(
                    source.database,
                    source.name,
                    query.flt,
                    search=query.search,
                    order=query.order,
                    after=query.after,
                    limit=query.limit,
                )
            except JudgestoreError as e:
                skipped.append(Skipped(source.name, str(e)))
                continue
            read.add(source.name)
            slices.append(part)
            merged = sorted([*merged, *part.rows], key=lambda r: r.key, reverse=newest)[: query.limit + 1]
        frontiers = [s.scanned_to for s in slices if s.scanned_to is not None]
        frontier = None
        if frontiers:  # the scan that got least far decides how far this page may go
            frontier = max(frontiers) if newest else min(frontiers)
            merged = [row for row in merged if (row.key >= frontier if newest else row.key <= frontier)]
        shown = merged[: query.limit]
        if len(merged) > query.limit:
            return shown, shown[-1].key, None
        return shown, frontier, frontier

    # ------------------------------------------------------------ a battle

    def battle(
        self, benchmark: str | None, instruction_id: str, pair: tuple[str, str] | None = None, task: str | None = None
    ) -> Battle:
        return self._locked(lambda: self._battle(benchmark, instruction_id, pair, task))

    def _battle(
        self, benchmark: str | None, instruction_id: str, pair: tuple[str, str] | None, task: str | None
    ) -> Battle:
        skipped: list[Skipped] = []
        judged: list[tuple[str, JudgementRecord]] = []
        # Only the databases that may hold the instruction's rows: a folder store's catalog rules out those without
        # the benchmark; a server's statements those without the instruction too (a few for every schema at once).
        of_instruction = (RowFilter(benchmark=benchmark, instruction_id=instruction_id),)
        selector = Selector(role="judgements", task=task)
        for name, database in self._databases(selector, ("judgements",), skipped, filters=of_instruction):
            try:
                records = list(queries.instruction_rows(database, benchmark, instruction_id))
            except JudgestoreError as e:  # a database that opens but cannot be read through: skipped, as on /rows
                skipped.append(Skipped(name, str(e)))
                continue
            for record in records:
                assert isinstance(record, JudgementRecord)
                judged.append((name, record))
        pairs = sorted({_pair_of(record) for _, record in judged if record.model_a and record.model_b})
        if pair is not None and pair not in pairs and (pair[1], pair[0]) in pairs:
            pair = (pair[1], pair[0])
        # By default a pair of two models: a model judged against itself (a judge's sanity check) sorting first
        # hid the instruction's real battles behind "Pairs judged" (was)
        by_default = sorted(pairs, key=lambda p: p[0] == p[1])
        chosen = pair if pair is not None else (by_default[0] if by_default else None)
        quoted: dict[str, list[str]] = {}  # each model's judgement prompts: the answers its judges were shown
        for _, record in judged:
            prompt = "\n".join(turn.content for turn in messages(record.input_text))
            for model in {record.model_a, record.model_b}:
                if model is not None:
                    quoted.setdefault(model, []).append(prompt)
        answers = self._answers(benchmark, instruction_id, chosen, task, skipped, quoted)
        where = f"{benchmark}/{instruction_id}" if benchmark is not None else instruction_id
        if chosen is None and not answers and not judged:
            without = "" if benchmark is not None else " without a benchmark (give benchmark= for a benchmark's)"
            raise NotFoundError(f"no row of instruction {where}{without} in {self.where}{_unread(skipped)}")
        if chosen is not None and chosen not in pairs and not any(a.row for a in answers):
            raise NotFoundError(
                f"no row of {chosen[0]} or {chosen[1]} for instruction {where} in {self.where}, and no judgement of "
                f"the pair{_unread(skipped)}"
            )
        models = list(chosen) if chosen is not None else [a.model for a in answers]
        system, rounds = _conversation(answers, models)
        by_judge: dict[str | None, list[Verdict]] = {}  # None: verdicts recorded without a judge
        pointwise = []
        for name, record in judged:
            if record.model_b is None:
                pointwise.append(_verdict(name, record, record.model_a or "", ""))
            elif chosen is not None and {record.model_a, record.model_b} == set(chosen):
                by_judge.setdefault(record.judge, []).append(_verdict(name, record, *chosen))
        judges = []
        for judge in sorted(by_judge, key=lambda j: (j is None, j or "")):
            verdicts = sorted(by_judge[judge], key=lambda v: (v.sample_index, v.row))
            judges.append(
                JudgeVerdicts(
                    judge,
                    [v for v in verdicts if v.orientation == "direct"],
                    [v for v in verdicts if v.orientation == "reversed"],
                    [v for v in verdicts if v.orientation not in ("direct", "reversed")],
                )
            )
        return Battle(benchmark, instruction_id, models, pairs, system, rounds, answers, judges, pointwise, skipped)

    def _answers(
        self,
        benchmark: str | None,
        instruction_id: str,
        pair: tuple[str, str] | None,
        task: str | None,
        skipped: list[Skipped],
        quoted: dict[str, list[str]],
    ) -> list[Answer]:
        """Each model's answer to this instruction from the completion databases: one its judges were shown (its
        completion is in a prompt of a judgement of the model, ``quoted``; of several, the longest: a prefix of it,
        an answer cut short, is in that prompt too), then the lowest sample (0, unless only later samples were
        stored: the rows page links those to this page too), then the longest conversation.

        A model answered in several databases (other settings) has one shown and the others counted
        (:attr:`Answer.elsewhere`): the page says so rather than pass one off as the only answer, and says it is
        the one its judges were shown (:attr:`Answer.judged`) only where no other answer of the model is in their
        prompts. Without a pair, completions stored without a model are one more answer, named :data:`NO_MODEL`.
        """
        candidates: dict[str, list[tuple[str, CompletionRecord]]] = {}
        selector = Selector(role="completions", task=task)
        filters = tuple(
            RowFilter(benchmark=benchmark, instruction_id=instruction_id, model=model) for model in pair or (None,)
        )
        for name, database in self._databases(selector, ("completions",), skipped, filters=filters):
            try:
                records = [
                    record
                    for model in (pair if pair is not None else (None,))
                    for record in queries.instruction_rows(database, benchmark, instruction_id, model=model)
                ]
            except JudgestoreError as e:  # as in _battle
                skipped.append(Skipped(name, str(e)))
                continue
            for record in records:
                assert isinstance(record, CompletionRecord)
                # A completion stored without a model is shown under NO_MODEL, as verdicts without a judge are
                # under "(no judge)": the rows page links every row of an instruction to its battle.
                model = NO_MODEL if record.model is None else record.model
                candidates.setdefault(model, []).append((name, record))
        models = (
            list(pair) if pair is not None else sorted(candidates, key=lambda m: (m == NO_MODEL, m))[:MAX_BATTLE_MODELS]
        )
        answers = []
        for model in models:
            if model not in candidates:
                answers.append(Answer(model, [], None, None))
                continue
            prompts = quoted.get(model, ())
            in_prompts = {record.completion for _, record in candidates[model] if _quoted(record, prompts)}
            name, record = min(candidates[model], key=lambda candidate: _rank(candidate[1], in_prompts))
            inputs = messages(record.input_text)
            earlier = [turn.content for turn in inputs if turn.role == "assistant"]
            turns = [*earlier, record.completion]
            others = len({database for database, _ in candidates[model]}) - 1
            # No other answer of the model is in its judges' prompts but as a part of this one (one cut short)
            whole = {text for text in in_prompts if not any(text != other and text in other for other in in_prompts)}
            judged = whole == {record.completion}
            answers.append(
                Answer(model, turns, (name, record.input_hash), record.finish_reason, inputs, others, judged)
            )
        return answers

    # ------------------------------------------------------------ judges

    def judges(self) -> JudgeList:
        return self._locked(self._judges)

    def _judges(self) -> JudgeList:
        """Rows per judge over every judgements database, each database's counts kept in the store's catalog while
        it is unchanged (the overview shows them: it would otherwise open every judgements database each time)."""
        totals: dict[str, int] = {}
        skipped: list[Skipped] = []
        chosen = self._chosen(Selector(role="judgements"), ("judgements",), None, ())
        for location, data in self.store.storage.remembered(chosen, _JUDGES, self._judges_of, lasting=readable):
            if UNREADABLE in data:
                skipped.append(Skipped(database_name(location), data[UNREADABLE]))
                continue
            for judge, n in data["judges"].items():
                totals[judge] = totals.get(judge, 0) + n
        return JudgeList(dict(sorted(totals.items())), skipped)

    def _judges_of(self, location: Location) -> dict[str, Any]:
        """A judgements database's rows per judge, as the store's catalog keeps them."""

        def derive() -> dict[str, Any]:
            database = self.store.open_existing(location)
            return {"judges": {} if database is None else queries.judges(database)}

        return _or_unreadable(derive)

    def judge(self, judge: str, limit: int = JUDGE_ROWS) -> JudgeView:
        return self._locked(lambda: self._judge(judge, limit))

    def _judge(self, judge: str, limit: int) -> JudgeView:
        skipped: list[Skipped] = []
        rows: list[tuple[str, JudgeRow]] = []
        total = 0
        for name, database in self._databases(
            Selector(role="judgements"), ("judgements",), skipped, filters=(RowFilter(judge=judge),)
        ):
            try:
                total += queries.judges(database).get(judge, 0)
                rows += [(name, row) for row in queries.judge_rows(database, judge, limit)]
            except JudgestoreError as e:
                skipped.append(Skipped(name, str(e)))
        if total == 0 and not skipped:  # with skipped databases, its judgements may be in them: the page names them
            raise NotFoundError(f"no judgement by judge {judge!r} in {self.where}")
        rows.sort(key=lambda item: item[1].created_at, reverse=True)
        rows = rows[:limit]
        judged = []
        pointwise = 0
        for name, row in rows:
            if row.model_a is None or row.model_b is None:
                pointwise += 1
                continue
            reading = read_verdict(row.completion, row.top_logprobs)
            question = (name, str(row.benchmark), str(row.instruction_id), str(row.sample_index))
            pref, slot = reading.preference, reading.slot
            confidence = None if pref is None or slot is None else pref.confidence
            unreadable = reading.logprobs_error is not None
            judged.append(JudgedRow(question, row.model_a, row.model_b, row.orientation, slot, confidence, unreadable))
        return JudgeView(judge, judge_figures(judged, pointwise), len(rows), total, skipped)

    # ------------------------------------------------------------ a row

    def row(self, name: str, input_hash: str) -> RowView:
        return self._locked(lambda: self._row(name, input_hash))

    def _row(self, name: str, input_hash: str) -> RowView:
        location = self._location(name)
        database = self.store.open_existing(location)
        record = None if database is None else database.get_many([input_hash], deferred=False).get(input_hash)
        if database is None or record is None:
            raise NotFoundError(f"no row {input_hash} in {name}")
        stored = database.metadata()
        metadata = metadata_bytes(stored.role, stored.task, stored.descriptor, stored.assumptions).decode()
        wrote, hit = queries.runs_of_row(database, record.run_id, record.created_at)
        adopted = None
        if record.adopted_from is not None:
            source = next(
                (database_name(loc) for loc in self.store.select(Selector(role=location.role,
                                                                           descriptor=record.adopted_from[:16]))),
                None,
            )  # fmt: skip
            adoption = next((a for a in adoptions(database) if a.source_descriptor == record.adopted_from), None)
            adopted = (source, adoption)
        judged = None
        if isinstance(record, JudgementRecord) and record.model_a and record.model_b:
            judged = _verdict(name, record, *_pair_of(record))
        try:
            positions, logprobs_error = decode(record.top_logprobs), None
        except InvalidInputError as e:  # a value another tool stored: the page says so, and shows the rest
            positions, logprobs_error = [], str(e)
        return RowView(name, location, record, messages(record.input_text), positions, metadata,
                       wrote, hit, adopted, judged, logprobs_error)  # fmt: skip


def _unread(skipped: Sequence[Skipped]) -> str:
    """What a "not found" adds when databases were skipped: its rows may be in them (was: a bare 404)."""
    if not skipped:
        return ""
    each = "; ".join(f"{s.name}: {s.error}" for s in skipped)
    return f", among the databases it could read; {len(skipped)} it could not read may hold them ({each})"


def _pair_of(record: JudgementRecord) -> tuple[str, str]:
    """The source pair (X, Y) of a pairwise judgement."""
    pair = source_pair(record.model_a, record.model_b, record.orientation)
    assert pair is not None  # callers pass pairwise rows
    return pair


def _verdict(name: str, record: JudgementRecord, first: str, second: str) -> Verdict:
    reading = read_verdict(record.completion, record.top_logprobs)
    slot, pref = reading.slot, reading.preference
    p_first = p_second = share = None
    if pref is not None:
        slot_of_first = "A" if record.model_a == first else "B"
        p_first, p_second = (pref.p_a, pref.p_b) if slot_of_first == "A" else (pref.p_b, pref.p_a)
        share = pref.share_a if slot_of_first == "A" else 1 - pref.share_a
    return Verdict(
        row=(name, record.input_hash),
        judge=record.judge,
        orientation=record.orientation,
        model_a=record.model_a,
        model_b=record.model_b,
        text=record.completion,
        slot=slot,
        favoured=favoured_model(slot, record.model_a, record.model_b),
        preference=pref,
        p_first=p_first,
        p_second=p_second,
        share_first=share,
        sample_index=record.sample_index,
        logprobs_error=reading.logprobs_error,
    )


def _conversation(answers: list[Answer], models: list[str]) -> tuple[list[Turn], list[Round]]:
    """The question turn by turn, from the longest stored input, with each model's answer to each turn.

    A turn is what the user said between two answers; model ``m``'s answer to
    turn ``i`` is its ``i``-th assistant message (its last turn: the completion).
    """
    source = max((a for a in answers if a.row is not None), key=lambda a: len(a.inputs), default=None)
    turns = source.inputs if source is not None else []
    system = [turn for turn in turns if turn.role == "system"]
    asked: list[list[Turn]] = [[]]
    for turn in turns:
        if turn.role == "assistant":
            asked.append([])
        elif turn.role != "system":
            asked[-1].append(turn)
    by_model = {answer.model: answer for answer in answers}
    rounds = []
    for i, question in enumerate(asked):
        replies = []
        for model in models:
            answer = by_model.get(model)
            replies.append(answer.turns[i] if answer is not None and i < len(answer.turns) else None)
        rounds.append(Round(question, replies))
    return system, rounds


def _quoted(record: CompletionRecord, judged_inputs: Sequence[str]) -> bool:
    """Whether a judge was shown ``record``'s completion (it is in one of ``judged_inputs``, the prompts of the
    judgements of its model)."""
    return bool(record.completion) and any(record.completion in text for text in judged_inputs)


def _rank(record: CompletionRecord, in_prompts: set[str]) -> tuple[bool, int, int, int]:
    """Where a battle ranks ``record`` among its model's answers (the lowest is shown): one in a judge's prompt
    (``in_prompts``: the completions that are), the longest of those, then the lower sample, then the longer
    conversation."""
    quoted = record.completion in in_prompts
    return not quoted, -len(record.completion) if quoted else 0, record.sample_index, -len(messages(record.input_text))
