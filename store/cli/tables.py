"""Tables that fit the terminal they are printed on, 80 columns included: the one way commands print tables.

Contract:

* A command builds a :class:`FittedTable` from :class:`Column` s, adds rows
  of strings (or styled :class:`~rich.text.Text`) and prints it with
  ``console.print(table)``. Each column says how its cells may give way
  (:class:`Fit`): counts, sizes, states and descriptor hashes never do;
  names are shortened in the middle and identifiers at the end, each only as
  far as keeps every two different values of the column different; free text
  wraps, or is cut with an ellipsis where one line per row matters more. A
  path gives way in its longest parts first, so that short ones (a role, a
  task, a descriptor hash) stay whole.
* A header is never cut. The layout is chosen at the console's width: the
  boxed table when every cell fits whole; else a table without borders
  whose shortened cells still fit (names keep as much as the width allows);
  else a list, one block of ``Header: value`` per row, where nothing is cut.
* The title and the caption are lines of their own, wrapped at the
  console's width (not squeezed into the table's).
* A control character of a cell (ESC, BEL, a carriage return... but not a
  tab or a newline), and a bidirectional one (``\\u202e``...), is shown as
  its escape (``\\x1b``): stored text (model output, rows fetched from
  others) never drives the terminal, nor reorders what it shows.
* ``--json`` output never comes here: it holds every value whole.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar

from rich import box
from rich.cells import cell_len as _rich_cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Span, Text

ELLIPSIS = "…"
T = TypeVar("T")
Cell = str | Text


class Fit(enum.Enum):
    """How a column's cells give way when the table does not fit."""

    WHOLE = "whole"  # never shortened: counts, sizes, states, descriptor hashes, times
    MIDDLE = "middle"  # a name (model, task): shortened in the middle, different values stay different
    PATH = "path"  # a path: its longest parts shortened in their middle first, different values stay different
    PREFIX = "prefix"  # an identifier (input hash): shortened at the end, different values stay different
    WRAP = "wrap"  # free text (a problem and its next step): wraps onto more lines, never cut
    CUT = "cut"  # free text where one line per row matters more (a completion): cut at the end


@dataclass(frozen=True)
class Column:
    header: str
    justify: Literal["left", "right"] = "left"
    fit: Fit = Fit.WHOLE
    max_width: int | None = None  # the widest its cells get even with room to spare (not for WHOLE)


# The narrowest a column that gives way gets (its header's width if that is wider).
_NARROWEST = {Fit.MIDDLE: 8, Fit.PATH: 48, Fit.PREFIX: 8, Fit.WRAP: 16, Fit.CUT: 8}
# The order in which columns that gave way get room back: names first, then text.
_ROOM_ORDER = (Fit.MIDDLE, Fit.PATH, Fit.PREFIX, Fit.CUT, Fit.WRAP)
LONG_TABLE = 200  # rows beyond which a table is drawn line by line (FittedTable._lines), not by rich's Table
_SHORTEST_PART = 5  # a path's part is not shortened below this (then the whole path is, in its middle)


def cell_len(text: str) -> int:
    """The cells ``text`` takes in a terminal, as rich counts them: printable ASCII (most of what a listing holds:
    names, paths, counts), with the ellipses that shortened it, one cell a character, measured in C; anything
    else by rich. A listing of thousands of databases measures hundreds of thousands of cells, which rich's own
    count (a set lookup per character, a function call per character past ASCII) makes a visible part of the
    command."""
    if text.isprintable() and (text.isascii() or text.replace(ELLIPSIS, "").isascii()):
        return len(text)
    return _rich_cell_len(text)


def shorten_middle(value: str, width: int) -> str:
    """``value`` in ``width`` cells at most: its start and its end around an ellipsis."""
    if cell_len(value) <= width:
        return value
    keep = max(width - 1, 0)
    head = _take(value, (keep + 1) // 2)
    tail = _take(value[::-1], keep // 2)[::-1]
    return head + ELLIPSIS + tail


def shorten_path(value: str, width: int) -> str:
    """``value`` in ``width`` cells at most: its longest ``/``-separated parts shortened in their middle first.

    The last part (a descriptor hash, a file name) stays whole:
    ``completions/demo/vllm/meta-llama%2FLlama-3.1-70B-Instruct/bc3b9435e9bdf9e6``
    keeps its role, task, provider and descriptor as long as the model's part
    can give way.
    """
    excess = cell_len(value) - width
    if excess <= 0:
        return value
    parts = value.split("/")
    lengths = [cell_len(part) for part in parts]
    cuttable = lengths[:-1]

    def cut(level: int) -> int:  # the cells taken off by bringing every cuttable part down to ``level``
        return sum(n - level for n in cuttable if n > level)

    if cut(_SHORTEST_PART) < excess:
        return shorten_middle(value, width)
    # A cell at a time from the longest part (the first of equals): every part down to a level, and the cells
    # still to take from the first parts standing at it.
    level = max(cuttable)
    while cut(level - 1) <= excess:
        level -= 1
    left = excess - cut(level)
    for i, n in enumerate(cuttable):
        if n >= level:
            parts[i] = shorten_middle(parts[i], level - (left > 0))
            left -= 1
    return "/".join(parts)


def shorten_end(value: str, width: int) -> str:
    """``value`` in ``width`` cells at most: its start and an ellipsis."""
    if cell_len(value) <= width:
        return value
    return _take(value, max(width - 1, 0)) + ELLIPSIS


def _take(value: str, cells: int) -> str:
    """The longest start of ``value`` that fits ``cells`` cells (wide characters count two)."""
    if value.isprintable() and value.replace(ELLIPSIS, "").isascii():  # a cell a character
        return value[: max(cells, 0)]
    taken, used = [], 0
    for char in value:
        used += cell_len(char)
        if used > cells:
            break
        taken.append(char)
    return "".join(taken)


# C0 but tab and newline, DEL, C1; and the bidirectional controls, which reorder what a terminal shows after them
# (a label "gpt\u202e4-mini" shown reversed)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(value: str) -> str:
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}" if found.group() < "\u0100" else
                        f"\\u{ord(found.group()):04x}", value)  # fmt: skip


def _visible(cell: Cell) -> Cell:
    """``cell`` with its control characters shown as escapes (see the module docstring)."""
    if isinstance(cell, Text):
        return Text(_escape(cell.plain), style=cell.style) if _CONTROL.search(cell.plain) else cell
    return _escape(cell) if _CONTROL.search(cell) else cell


def _one_line(value: str) -> str:
    return " ".join(value.split())


_SHORTEN = {Fit.MIDDLE: shorten_middle, Fit.PATH: shorten_path, Fit.PREFIX: shorten_end, Fit.CUT: shorten_end}


class FittedTable:
    """A table that chooses its layout at the width it is printed at (see the module docstring)."""

    def __init__(self, title: str | None, columns: Sequence[Column], caption: str | None = None) -> None:
        self.title = title
        self.columns = list(columns)
        self.caption = caption
        self.rows: list[list[Cell]] = []
        # Each column's cells as text and its widths, measured once per set of rows: a layout asks for them
        # several times, and a listing of thousands of databases has thousands of cells per column.
        self._measured: dict[tuple[str, int], Any] = {}

    def add_row(self, *cells: Cell | None) -> None:
        """One row; missing trailing cells are empty."""
        row: list[Cell] = ["" if cell is None else _visible(cell) for cell in cells]
        self.rows.append(row + [""] * (len(self.columns) - len(row)))
        self._measured.clear()

    # ---------------------------------------------------------------- widths

    def _measure(self, what: Callable[[int], T], index: int) -> T:
        key = (what.__name__, index)
        if key not in self._measured:
            self._measured[key] = what(index)
        return self._measured[key]  # type: ignore[no-any-return]

    def _plain(self, index: int) -> list[str]:
        return self._measure(self._plain_values, index)

    def _plain_values(self, index: int) -> list[str]:
        fit = self.columns[index].fit
        values = [cell.plain if isinstance(cell := row[index], Text) else cell for row in self.rows]
        return [_one_line(v) for v in values] if fit is not Fit.WRAP else values

    def _whole(self, index: int) -> int:
        """The width at which every cell of the column is whole."""
        return self._measure(self._whole_width, index)

    def _whole_width(self, index: int) -> int:
        widest = max((cell_len(line) for v in self._plain(index) for line in v.splitlines() or [""]), default=0)
        return max(widest, cell_len(self.columns[index].header))

    def _narrowest(self, index: int) -> int:
        """The narrowest the column may get: whole cells stay whole, different names stay different."""
        return self._measure(self._narrowest_width, index)

    def _narrowest_width(self, index: int) -> int:
        column = self.columns[index]
        whole = self._whole(index)
        if column.fit is Fit.WHOLE:
            return whole
        floor = max(cell_len(column.header), min(whole, _NARROWEST[column.fit]))
        if column.fit is Fit.WRAP:  # no word is broken (a hash, a command's argument: copied whole): the longest fits
            longest = max((cell_len(word) for v in self._plain(index) for word in v.split()), default=0)
            return max(floor, min(whole, longest))
        if column.fit is Fit.CUT:
            return floor
        distinct = set(self._plain(index))
        shorten = _SHORTEN[column.fit]
        for width in range(floor, whole):
            if _stay_apart(distinct, shorten, width):
                return width
        return whole

    def _natural(self, index: int) -> int:
        """The width the column takes when there is room: whole, or ``max_width`` if that keeps names apart."""
        column = self.columns[index]
        whole = self._whole(index)
        if column.fit is Fit.WHOLE or column.max_width is None:
            return whole
        return max(min(whole, column.max_width), self._narrowest(index))

    def _widths(self, available: int, natural: list[int]) -> list[int] | None:
        """Column widths that fit ``available`` cells: the narrowest, given room back up to natural."""
        widths = [self._narrowest(i) for i in range(len(self.columns))]
        spare = available - sum(widths)
        if spare < 0:
            return None
        for fit in _ROOM_ORDER:
            wanting = [i for i, c in enumerate(self.columns) if c.fit is fit and widths[i] < natural[i]]
            while spare > 0 and wanting:  # one cell at a time, so that columns of a kind share the room
                for i in list(wanting):
                    if spare == 0:
                        break
                    widths[i] += 1
                    spare -= 1
                    if widths[i] >= natural[i]:
                        wanting.remove(i)
        return widths

    # ---------------------------------------------------------------- rendering

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.title:
            yield Text(self.title, style="table.title")
        n = len(self.columns)
        natural = [self._natural(i) for i in range(n)]
        if sum(natural) + 3 * n + 1 <= width:  # boxed: a border and a space each side of every cell
            yield self._table(natural, boxed=True)
        elif (widths := self._widths(width - 2 * (n - 1), natural)) is not None:  # two spaces between columns
            yield self._table(widths, boxed=False)
        else:
            yield from _rendered(self._blocks(width, natural, styled=console.color_system is not None), console, width)
        if self.caption:
            yield Text(self.caption, style="table.caption")

    def _table(self, widths: list[int], *, boxed: bool) -> Table | Lines:
        if len(self.rows) > LONG_TABLE and not self._wraps(widths):
            return Lines(self._lines(widths, boxed=boxed))
        if boxed:
            table = Table(show_header=True)
        else:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
        for column, width in zip(self.columns, widths, strict=True):
            wraps = column.fit is Fit.WRAP
            table.add_column(column.header, justify=column.justify, width=width, no_wrap=not wraps,
                             overflow="fold" if wraps else "ellipsis")  # fmt: skip
        for row in self.rows:
            cells = zip(self.columns, row, widths, strict=True)
            table.add_row(*(self._cell(column, cell, width) for column, cell, width in cells))
        return table

    def _wraps(self, widths: list[int]) -> bool:
        """Whether a cell of a column that wraps needs more than one line at these widths."""
        for i, (column, width) in enumerate(zip(self.columns, widths, strict=True)):
            if column.fit is Fit.WRAP and any("\n" in v or cell_len(v) > width for v in self._plain(i)):
                return True
        return False

    def _lines(self, widths: list[int], *, boxed: bool) -> Iterator[Line]:
        """The table as :meth:`_table` draws it with rich's :class:`~rich.table.Table` (heavy-headed box, or
        borderless with a rule under the header), line by line: rich measures every cell of a table anew, about
        1 ms a row, which a listing of thousands of databases cannot pay. For one-line cells only: a cell that
        must wrap makes :meth:`_table` use rich's table whatever the rows."""
        edge, sep, pad = ("│ ", " │ ", " │") if boxed else ("", "  ", "")
        if boxed:
            yield Line("┏" + "┳".join("━" * (w + 2) for w in widths) + "┓")
        header: list[tuple[str, str | Style]] = [(c.header, "bold") for c in self.columns]
        yield self._line(header, widths, ("┃ ", " ┃ ", " ┃") if boxed else (edge, sep, pad))
        if boxed:
            yield Line("┡" + "╇".join("━" * (w + 2) for w in widths) + "┩")
        else:
            yield Line("─" * (sum(widths) + 2 * (len(widths) - 1)))
        for row in self.rows:
            yield self._line([self._plain_cell(*cw) for cw in zip(self.columns, row, widths, strict=True)], widths,
                             (edge, sep, pad))  # fmt: skip
        if boxed:
            yield Line("└" + "┴".join("─" * (w + 2) for w in widths) + "┘")

    def _line(self, cells: list[tuple[str, str | Style]], widths: list[int], frame: tuple[str, str, str]) -> Line:
        edge, sep, pad = frame
        parts, spans, at = [edge], [], len(edge)
        for i, ((value, style), width, column) in enumerate(zip(cells, widths, self.columns, strict=True)):
            if cell_len(value) > width:  # what rich's ellipsis overflow does with a cell wider than its column
                value = shorten_end(value, width)
            room = " " * (width - cell_len(value))
            text = room + value if column.justify == "right" else value + room
            if i:
                parts.append(sep)
                at += len(sep)
            if style:
                start = at + (len(room) if column.justify == "right" else 0)
                spans.append(Span(start, start + len(value), style))
            parts.append(text)
            at += len(text)
        parts.append(pad)
        return Line("".join(parts), spans, no_wrap=True)

    @staticmethod
    def _plain_cell(column: Column, cell: Cell, width: int) -> tuple[str, str | Style]:
        """What :meth:`_cell` gives, as its text and its style (no :class:`Text` built: a long table has many)."""
        value, style = (cell.plain, cell.style) if isinstance(cell, Text) else (cell, "")
        if column.fit in (Fit.WHOLE, Fit.WRAP):
            return value, style
        return _SHORTEN[column.fit](_one_line(value), width), style

    @staticmethod
    def _cell(column: Column, cell: Cell, width: int) -> Text:
        text = _text(cell)
        if column.fit in (Fit.WHOLE, Fit.WRAP):
            return text
        return Text(_SHORTEN[column.fit](_one_line(text.plain), width), style=text.style)

    def _blocks(self, width: int, natural: list[int], *, styled: bool) -> Iterator[Line]:
        """The list layout: per row, ``Header: value`` items packed into lines, rows apart by a blank line.

        Each value is as long as it is in a table with room to spare: whole, or its column's
        ``max_width`` as far as that keeps different names apart (a completion stays a glance).
        Lines carry their styles' spans only when ``styled`` (a console without colours prints none).
        """
        bold = Style(bold=True)
        labels = [f"{column.header}: " for column in self.columns]
        for number, row in enumerate(self.rows):
            if number:
                yield Line("")
            line, spans = "", list[Span]()  # built as a string and its styled spans: rich's Text.append costs 10x
            cells, items = 0, 0  # the line's width and items, kept as it grows (a listing has thousands of rows)
            for column, label, cell, room in zip(self.columns, labels, row, natural, strict=True):
                plain, style = self._plain_cell(column, cell, room)
                if not plain:
                    continue
                item = label + plain
                item_cells = cell_len(item)
                if items and cells + 2 + item_cells > width:
                    yield Line(line, spans)
                    line, spans, cells, items = "  ", [], 2, 0
                elif items:
                    line += "  "
                    cells += 2
                if styled:
                    at = len(line)
                    spans.append(Span(at, at + len(label), bold))
                    if style:
                        spans.append(Span(at + len(label), at + len(item), style))
                    if isinstance(cell, Text) and column.fit in (Fit.WHOLE, Fit.WRAP):  # kept whole, spans too
                        spans += [span.move(at + len(label)) for span in cell.spans]
                line += item
                cells += item_cells
                items += 1
            if items:
                yield Line(line, spans)


def _stay_apart(values: Iterable[str], shorten: Callable[[str, int], str], width: int) -> bool:
    """Whether ``values`` (all different) stay different shortened to ``width``; stops at the first two that
    do not (at the narrow widths a column tries first, that is soon)."""
    seen: set[str] = set()
    for value in values:
        shortened = shorten(value, width)
        if shortened in seen:
            return False
        seen.add(shortened)
    return True


class Line(NamedTuple):
    """One printed line as its text and its styled spans: a :class:`~rich.text.Text` is built only where the
    line needs rich (colours, or wider than the console), since a listing of thousands of databases has tens of
    thousands of lines."""

    text: str
    spans: tuple[Span, ...] | list[Span] = ()
    no_wrap: bool = False

    def styled(self) -> Text:
        return Text(self.text, spans=list(self.spans), end="\n", no_wrap=self.no_wrap or None)


class Lines:
    """Lines printed as they are (a long table drawn by :meth:`FittedTable._lines`)."""

    def __init__(self, lines: Iterable[Line]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from _rendered(self.lines, console, options.max_width)


def _rendered(lines: Iterable[Line], console: Console, width: int) -> RenderResult:
    """Each line as rich prints it; one that fits ``width`` rendered straight to its segments (rich would
    measure and wrap it first, several times the cost, for the same segments). Without colours (output to a
    file or a pipe) a line's styles print nothing, so its text is the one segment (a listing of thousands of
    databases is a hundred thousand lines); printable ASCII that fits is that segment as it is (nothing for
    rich to strip or measure)."""
    plain = console.color_system is None
    for line in lines:
        if plain and line.text.isascii() and line.text.isprintable() and len(line.text) <= width:
            yield Segment(line.text + "\n")
            continue
        styled = line.styled()
        text = styled.plain
        if cell_len(text) > width:
            yield styled
        elif plain and "\t" not in text:
            yield Segment(text + "\n")
        else:
            yield from styled.render(console, end="\n")


def _text(cell: Cell) -> Text:
    return cell if isinstance(cell, Text) else Text(cell)
