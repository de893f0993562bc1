"""``--help`` that reads whole in an 80-column terminal: every option name, its value, its help.

Contract:

* :func:`plain_help` is applied once, by :func:`store.cli.app.build_app`, to
  the app and its command groups: help is click's plain layout (an option
  name too long for its column gets a line of its own, never an ellipsis;
  a flag shows no value type), with the options grouped under the panels
  the commands declare (``rich_help_panel``: Model, Run, Store, Select
  databases, Filter rows...).
* Wrapping breaks lines between words only, never at a hyphen, so that
  ``./judgestore-data`` or ``--chat-template-kwarg`` stay whole; an
  indented paragraph (an example command) is printed as written.
* typer's boxed help is not used: it divides an 80-column terminal among
  up to seven columns and cuts option names with an ellipsis
  (``--chat-template-…``), and shows ``<bool>`` after every flag.
"""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from store.cli.options import OnceCommand

_UNBREAKABLE = "\u2011"  # a hyphen the wrapper does not break at; turned back into "-" once wrapped
_OPTIONS = "Options"


def _unbreakable(text: str) -> str:
    return text.replace("-", _UNBREAKABLE)


def _restore(formatter: Any, start: int) -> None:
    formatter.buffer[start:] = [part.replace(_UNBREAKABLE, "-") for part in formatter.buffer[start:]]


def _examples_kept(text: str) -> str:
    """``text`` with each indented paragraph (an example command) marked for click to print as written: rewrapped,
    a long command broke mid-way and a ``\\`` continuation landed inside a line, so that a pasted copy failed."""
    paragraphs = text.split("\n\n")
    return "\n\n".join(
        f"\b\n{paragraph}"
        if paragraph.strip() and all(line.startswith(" ") for line in paragraph.splitlines())
        else paragraph
        for paragraph in paragraphs
    )


class PanelledCommand(OnceCommand):
    """A command whose help lists its options under their panels, in click's plain layout (and whose options that
    take one value take it once: :class:`~store.cli.options.OnceCommand`)."""

    def format_help_text(self, ctx: Any, formatter: Any) -> None:
        text = _examples_kept(inspect.cleandoc(self.help).partition("\f")[0]) if self.help else ""
        if text:
            start = len(formatter.buffer)
            formatter.write_paragraph()
            with formatter.indentation():
                formatter.write_text(_unbreakable(text))
            _restore(formatter, start)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        panels: dict[str, list[tuple[str, str]]] = {"Arguments": [], _OPTIONS: []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            default = "Arguments" if param.param_type_name == "argument" else _OPTIONS
            panel = getattr(param, "rich_help_panel", None) or default
            name = record[0]
            if param.param_type_name == "argument" and param.metavar:  # typer adds its type: PATH... <list[Path]>
                name = param.metavar + ("..." if param.nargs == -1 else "")
            panels.setdefault(panel, []).append((name, _unbreakable(record[1])))
        start = len(formatter.buffer)
        for name, records in panels.items():
            if records:
                with formatter.section(name):
                    formatter.write_dl(records)
        _restore(formatter, start)


class PanelledGroup(TyperGroup):
    """A command group whose help gives each command's first paragraph whole (click cuts it at ~45 characters)."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                summary = inspect.cleandoc(command.short_help or command.help or "").split("\n\n")[0]
                rows.append((name, _unbreakable(" ".join(summary.split()))))
        if rows:
            start = len(formatter.buffer)
            with formatter.section("Commands"):
                formatter.write_dl(rows)
            _restore(formatter, start)


def plain_help(app: typer.Typer) -> None:
    """Give ``app``, its command groups and all their commands the help described in the module docstring."""
    app.rich_markup_mode = None
    if not app.info.cls or app.info.cls is TyperGroup:  # typer's defaults are placeholders that are false
        app.info.cls = PanelledGroup
    for command in app.registered_commands:
        if not command.cls or command.cls is TyperCommand:  # typer's default, unless a command chose its own
            command.cls = PanelledCommand
    for group in app.registered_groups:
        if not group.cls or group.cls is TyperGroup:
            group.cls = PanelledGroup
        if group.typer_instance is not None:
            plain_help(group.typer_instance)
