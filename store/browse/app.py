"""The browser's web app: Starlette routes that read the URL, ask :class:`~store.browse.browser.Browser`, render.

Contract:

* Every page is a GET whose whole state is in its URL (filters, search,
  order, cursor, the battle's pair), so a page can be shared, reloaded and
  reached again with the back button. There are no forms that post and no
  cookies.
* Templates are Jinja2 with autoescaping on: every stored string (prompts,
  completions, model names, metadata) is escaped; the only markup inserted
  unescaped is :func:`store.browse.render.markdown`'s, which escapes raw
  HTML itself. Pages ship no script: the Content-Security-Policy says
  ``script-src 'none'`` and allows styles and images only from the app
  itself (so even a markup bug could not run a stored ``<script>`` or fetch
  a URL a prompt chose). Charts are SVG drawn on the server; the CSS is in
  the package (``static/``): nothing is fetched from the network.
* Bound to loopback, the app answers only requests whose ``Host`` names
  this machine: ``localhost``, a loopback IP address (``127.0.0.2`` as well
  as ``127.0.0.1``, ``[::1]``) or a name it was bound by (``hosts``). A web
  page elsewhere cannot reach it by DNS rebinding: its requests name the
  page's own domain.
* Every response says how long the server spent on it (``Server-Timing:
  app;dur=<ms>``, which ``bench/browse_bench.py`` reads).
* A bad parameter is a 400 page naming it, something absent a 404, a
  database that cannot be read a 500 page with the store's typed error:
  never a traceback.
"""

from __future__ import annotations

import ipaddress
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes, urlencode, urlsplit

import orjson
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from rich.filesize import decimal
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from store.browse.browser import NO_MODEL, Browser
from store.browse.pages import NotFoundError, RowsQuery, database_name
from store.browse.queries import ORDERS, SCAN_WINDOW, Key
from store.browse.render import Typed, clipped, input_snippet, markdown, shown
from store.browse.verdicts import CONFIDENCE_BINS, read_preference, source_pair
from store.errors import InvalidInputError, JudgestoreError
from store.layout import Selector
from store.tables.filters import RowFilter, parse_timestamp
from store.tables.models import ORIENTATIONS

HERE = Path(__file__).parent
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_PAGE_ROWS = 500
# Longer is refused: on PostgreSQL a case-insensitive regular expression costs the server time to compile that grows
# faster than its length (2,500 characters 1.7 s, 20,000 over 20 s, every other page waiting on the one reader: was)
MAX_SEARCH_CHARS = 1000
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; script-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)
# The rows page's filters: URL parameter -> RowFilter field (dates and lists are read apart).
ROW_FILTERS = ("model", "judge", "benchmark", "instruction_id", "run_id")


class BadParameterError(InvalidInputError):
    """A URL parameter the page cannot use."""


# ---------------------------------------------------------------- the middleware


class Guard:
    """Security headers and ``Server-Timing`` on every response; a loopback app answers loopback hosts only."""

    def __init__(self, app: ASGIApp, *, loopback_only: bool, hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.loopback_only = loopback_only
        self.names = LOOPBACK_NAMES | {name.lower() for name in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.loopback_only:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not self._names_this_machine(_hostname(host)):
                response = PlainTextResponse(
                    "this browser answers requests for 127.0.0.1, localhost or the host it serves on only",
                    status_code=403,
                )
                await response(scope, receive, send)
                return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                elapsed = (time.perf_counter() - started) * 1000
                headers = [*message.get("headers", []), *SECURITY_HEADERS]
                headers.append((b"server-timing", f"app;dur={elapsed:.1f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed)

    def _names_this_machine(self, name: str | None) -> bool:
        """A loopback name or address, or a host it was bound by: never a name another machine's DNS answers."""
        if name is None:
            return False
        if name in self.names:
            return True
        try:
            return ipaddress.ip_address(name).is_loopback  # an address names no domain a page elsewhere controls
        except ValueError:
            return False


# ---------------------------------------------------------------- templates


def _when(moment: datetime | None) -> str:
    return "" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def _number(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "–"
    return f"{value:.{digits}f}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _json(value: object) -> str:
    from store import jsonvalues  # NaN and infinities kept as the store writes them

    return orjson.dumps(jsonvalues.to_plain(value), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def _hostname(host: str) -> str | None:
    """The name a ``Host`` header asks for; None for one that is no host (``[``, a ``user@`` part, which a URL
    parser would drop), refused as any other."""
    if "@" in host:
        return None
    try:
        return urlsplit(f"//{host}").hostname
    except ValueError:
        return None


def _without(params: Any, *names: str) -> dict[str, list[str]]:
    """A URL's parameters (repeated ones kept) without ``names``: what a link that changes them starts from."""
    kept: dict[str, list[str]] = {}
    for name, value in params.multi_items() if hasattr(params, "multi_items") else params.items():
        if name not in names:  # a value is one (a request's) or a list of them (what this function returned)
            kept.setdefault(name, []).extend(value if isinstance(value, list | tuple) else [value])
    return kept


def _with(params: Any, **changes: object) -> dict[str, Any]:
    return {**_without(params, *changes), **changes}


def link(path: str, **params: object) -> str:
    """``path`` with the parameters that are set, URL-encoded (repeated for tuples)."""
    pairs: list[tuple[str, str]] = []
    for name, value in params.items():
        if value is None or value == "":
            continue
        for item in value if isinstance(value, tuple | list) else (value,):
            pairs.append((name, str(item)))
    return f"{path}?{urlencode(pairs)}" if pairs else path


def row_link(name: str, input_hash: str) -> str:
    return link("/row", db=name, hash=input_hash)


def battle_link(benchmark: str | None, instruction_id: str | None, pair: tuple[str, str] | None = None,
                task: str | None = None) -> str:  # fmt: skip
    return link("/battle", benchmark=benchmark, instruction_id=instruction_id, a=pair[0] if pair else None,
                b=pair[1] if pair else None, task=task)  # fmt: skip


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=shown,
    )
    env.filters.update(
        when=_when, number=_number, percent=_percent, json=_json, markdown=markdown, size=decimal,
        snippet=input_snippet, clipped=clipped, exp=math.exp, dict_without=_without, dict_with=_with, typed=Typed,
    )  # fmt: skip
    env.globals.update(
        link=link, row_link=row_link, battle_link=battle_link, database_name=database_name,
        CONFIDENCE_BINS=CONFIDENCE_BINS, ORDERS=ORDERS, ORIENTATIONS=ORIENTATIONS, read_preference=read_preference,
        pair_of=lambda row: source_pair(row.model_a, row.model_b, row.orientation),
        scan_window=SCAN_WINDOW, NO_MODEL=NO_MODEL,
    )  # fmt: skip
    return env


# ---------------------------------------------------------------- reading a URL


def _query_is_text(request: Request) -> None:
    """Refuse a query whose percent-escapes are no UTF-8 text: the server read them as U+FFFD, and a page filtered
    on that (`model=%ff%fe`: "No rows match") without a word (was)."""
    raw: bytes = request.scope.get("query_string", b"")
    try:
        unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadParameterError(
            f"the URL's query is not UTF-8 text (percent-escapes of bytes {e.object[e.start : e.end]!r})"
        ) from None


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name)
    return value if value else None


def _choice(params: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    value = _text(params, name)
    if value is not None and value not in choices:
        raise BadParameterError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def rows_query(request: Request) -> RowsQuery:
    """The rows page's query from its URL (see :data:`ROW_FILTERS`)."""
    params = request.query_params
    role = _choice(params, "role", ("completions", "judgements"))
    values: dict[str, Any] = {name: _text(params, name) for name in ROW_FILTERS}
    values["orientation"] = _choice(params, "orientation", ORIENTATIONS)
    reasons = tuple(value for value in params.getlist("finish_reason") if value)
    values["finish_reasons"] = reasons or None
    for name, field in (("since", "created_after"), ("until", "created_before")):
        value = _text(params, name)
        values[field] = None if value is None else parse_timestamp(value)
    order = _choice(params, "order", ORDERS) or "newest"
    after = _text(params, "after")
    try:
        limit = int(params.get("limit") or 50)
    except ValueError as e:
        raise BadParameterError(f"limit must be a number of rows, got {params.get('limit')!r}") from e
    if not 1 <= limit <= MAX_PAGE_ROWS:
        raise BadParameterError(f"limit must be between 1 and {MAX_PAGE_ROWS}, got {limit}")
    search = _text(params, "q")
    if search is not None and len(search) > MAX_SEARCH_CHARS:
        raise BadParameterError(
            f"the search is {len(search):,} characters long; search at most {MAX_SEARCH_CHARS:,} (a distinctive part)"
        )
    return RowsQuery(
        selector=Selector(role=role, task=_text(params, "task")),  # type: ignore[arg-type]
        flt=RowFilter(**values),
        database=_text(params, "db"),
        search=search,
        order=order,  # type: ignore[arg-type]
        after=None if after is None else Key.from_token(after),
        limit=limit,
    )


def _required(params: Mapping[str, str], name: str) -> str:
    value = _text(params, name)
    if value is None:
        raise BadParameterError(f"the page needs the {name} parameter")
    return value


def _input_hash(params: Mapping[str, str]) -> str:
    """The ``hash`` parameter: a whole input hash, in hex digits of either case (as ``query --input-hash``)."""
    value = _required(params, "hash").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise BadParameterError(f"hash must be a whole input hash (64 hex digits), got {value[:80]!r}")
    return value


# ---------------------------------------------------------------- the app


def create_app(browser: Browser, *, loopback_only: bool = True, hosts: Iterable[str] = ()) -> ASGIApp:
    """The browser's ASGI app over ``browser``'s store (``hosts``: names it was bound by, answered as loopback's)."""
    env = environment()

    def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(request=request, store=browser.where, params=request.query_params,
                                                 **context)  # fmt: skip
        return HTMLResponse(html, status_code=status)

    def handled(work: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                _query_is_text(request)
                return work(request)
            except NotFoundError as e:
                return page(request, "error.html", 404, title="Not found", message=str(e))
            except InvalidInputError as e:
                return page(request, "error.html", 400, title="Bad request", message=str(e))
            except JudgestoreError as e:
                return page(request, "error.html", 500, title="The store could not be read", message=str(e))

        return endpoint

    def overview(request: Request) -> Response:
        databases = browser.overview(count_all=request.query_params.get("finish_reasons") == "count")
        return page(request, "overview.html", databases=databases, judges=browser.judges().totals)

    def rows(request: Request) -> Response:
        query = rows_query(request)
        return page(request, "rows.html", query=query, result=browser.rows(query))

    def battle(request: Request) -> Response:
        params = request.query_params
        first, second = _text(params, "a"), _text(params, "b")
        if (first is None) != (second is None):
            raise BadParameterError("a pair needs both models: a and b")
        pair = (first, second) if first is not None and second is not None else None
        result = browser.battle(_text(params, "benchmark"), _required(params, "instruction_id"), pair,
                                _text(params, "task"))  # fmt: skip
        return page(request, "battle.html", battle=result, task=_text(params, "task"))

    def judges(request: Request) -> Response:
        judge = _text(request.query_params, "judge")
        if judge is None:
            return page(request, "judges.html", judges=browser.judges())
        return page(request, "judge.html", view=browser.judge(judge))

    def row(request: Request) -> Response:
        params = request.query_params
        return page(request, "row.html", view=browser.row(_required(params, "db"), _input_hash(params)))

    async def not_found(request: Request, exc: Exception) -> Response:
        return page(request, "error.html", 404, title="Not found", message=f"no page at {request.url.path}")

    async def failed(request: Request, exc: Exception) -> Response:
        # No traceback reaches the page; the server's log has it.
        return page(request, "error.html", 500, title="Something went wrong", message=type(exc).__name__)

    app = Starlette(
        routes=[
            Route("/", handled(overview)),
            Route("/rows", handled(rows)),
            Route("/battle", handled(battle)),
            Route("/judges", handled(judges)),
            Route("/row", handled(row)),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        exception_handlers={404: not_found, 500: failed},
    )
    return Guard(app, loopback_only=loopback_only, hosts=hosts)
