"""``judgestore browse``: the read-only web app over a store (:mod:`store.browse`).

Contract:

* Thin: parse, open the store read-only, hand it to
  :func:`store.browse.server.serve`. The web stack (Starlette, Jinja2,
  uvicorn, markdown-it-py: the ``browse`` extra) is imported inside the
  command, never when ``judgestore`` starts; without it the command says
  what to install.
* Binds 127.0.0.1 unless ``--host`` says otherwise, and then says what that
  exposes before it serves.
"""

import importlib.util
from typing import Annotated

import typer

from store.cli.common import command_errors, stderr
from store.cli.options import grouped, store_settings
from store.errors import MissingDependencyError, install_hint
from store.settings import Settings
from store.store import Store

BROWSE_MODULES = ("starlette", "jinja2", "uvicorn", "markdown_it")
DEFAULT_PORT = 8765  # store.browse.server.DEFAULT_PORT (not imported here: it would import the web stack)


def register(app: typer.Typer) -> None:
    app.command("browse")(command_errors(grouped(settings=store_settings)(browse_command)))


def browse_command(
    settings: Settings,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; anything but loopback says what it exposes.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: any free port).")] = DEFAULT_PORT,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the default web browser on it.")] = False,
) -> None:
    """Browse the store in a web browser: answers and verdicts side by side, judges, rows.

    Read-only: opens every database read-only (a read-only transaction on a
    server) and writes nothing. Pages: an overview of the databases, rows
    with filters and search, a battle (one instruction: both models' answers
    and each judge's verdicts in both orientations, with the verdict token's
    preference), a judge's figures (win rates, position bias, agreement
    between orientations), and every detail of a row. Ctrl-C stops it.

    Examples:

        judgestore browse --open

        judgestore browse --store-url postgresql+psycopg://eval@db/judgestore \\
            --port 9000
    """
    missing = [name for name in BROWSE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(
            f"judgestore browse needs {', '.join(missing)}: "
            + install_hint("browse", "starlette jinja2 uvicorn markdown-it-py")
        )
    from store.browse.browser import Browser
    from store.browse.server import serve

    with Store(settings, readonly=True) as store:
        store.require_present("to browse")
        serve(Browser(store), host, port, open_browser=open_browser,
              say=lambda line: stderr().print(line, soft_wrap=True))  # fmt: skip
