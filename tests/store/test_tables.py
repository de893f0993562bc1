"""store/cli/tables.py: a table fits the width it is printed at without cutting a header or merging two rows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from store.cli import tables
from store.cli.tables import Column, Fit, FittedTable, shorten_end, shorten_middle, shorten_path


def render(table: FittedTable, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(table)
    return console.export_text().splitlines()


def models_table(*names: str, caption: str | None = None) -> FittedTable:
    columns = [Column("Model", fit=Fit.MIDDLE, max_width=48), Column("Descriptor"), Column("Rows", justify="right")]
    table = FittedTable("Databases in a store whose title is long enough to need wrapping somewhere", columns, caption)
    for i, name in enumerate(names):
        table.add_row(Text(name), f"{i:016x}", f"{i * 1000:,}")
    return table


@given(
    st.text(alphabet=st.characters(max_codepoint=0x3100))
    | st.text(alphabet=st.characters(max_codepoint=0x7F) | st.just("…"))
)
def test_the_tables_count_cells_as_rich_does(value: str) -> None:
    # The tables count printable ASCII themselves (it is faster); every string must measure as rich measures it.
    assert tables.cell_len(value) == cell_len(value)


def _shorten_path_a_cell_at_a_time(value: str, width: int) -> str:
    """shorten_path's contract, literally: a cell at a time off the longest part but the last (the first of
    equals), none below 5 cells (then the whole path in its middle)."""
    excess = cell_len(value) - width
    if excess <= 0:
        return value
    parts = value.split("/")
    lengths = [cell_len(part) for part in parts]
    while excess > 0:
        longest = max(range(len(parts) - 1), key=lambda i: lengths[i], default=None)
        if longest is None or lengths[longest] <= 5:
            return shorten_middle(value, width)
        lengths[longest] -= 1
        excess -= 1
    return "/".join(shorten_middle(part, n) for part, n in zip(parts, lengths, strict=True))


@given(st.lists(st.text(alphabet="ab長/", max_size=30), min_size=1, max_size=6), st.integers(0, 120))
def test_a_path_gives_way_a_cell_at_a_time_from_its_longest_part(parts: list[str], width: int) -> None:
    path = "/".join(parts)
    assert shorten_path(path, width) == _shorten_path_a_cell_at_a_time(path, width)


def test_shortening_keeps_the_start_and_the_end_within_the_width() -> None:
    assert shorten_middle("meta-llama/Llama-3.1-8B-Instruct", 16) == "meta-lla…nstruct"
    assert shorten_middle("tiny-a", 8) == "tiny-a"
    assert shorten_end("354ea1afe0766d03", 12) == "354ea1afe07…"
    assert cell_len(shorten_middle("長い文章のモデル名です", 9)) <= 9  # wide characters count two cells
    long = "completions/demo/vllm/meta-llama%2FLlama-3.1-70B-Instruct/bc3b9435e9bdf9e6"
    assert shorten_path(long, 50) == "completions/demo/vllm/meta-…truct/bc3b9435e9bdf9e6"  # the model's part gave way
    assert cell_len(shorten_path(long, 30)) <= 30


def test_a_table_that_fits_keeps_its_box_and_every_cell_whole() -> None:
    lines = render(models_table("tiny-a", "tiny-b", caption="2 databases"), 120)
    assert lines[0].startswith("Databases in a store") and lines[-1] == "2 databases"
    assert any("┃ Model" in line for line in lines)
    assert any("│ tiny-a " in line for line in lines) and any("│ tiny-b " in line for line in lines)


def test_narrow_names_are_shortened_in_the_middle_but_stay_apart() -> None:
    names = ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct", "tiny-a")
    lines = render(models_table(*names), 50)
    assert all(cell_len(line) <= 50 for line in lines), lines
    cells = [line.split()[0] for line in lines if line.rstrip().endswith(("0", "1,000", "2,000"))]
    assert len(cells) == 3 and len(set(cells)) == 3, lines  # three rows, three different names
    assert "tiny-a" in cells and any("…" in cell for cell in cells)
    assert all(not line.startswith(("│", "┃")) for line in lines)  # the borderless layout
    assert lines[1] == "need wrapping somewhere"  # the title wraps at the terminal's width, not the table's
    assert lines[2].split() == ["Model", "Descriptor", "Rows"]  # headers whole


def test_too_narrow_for_a_table_becomes_a_list_that_cuts_nothing() -> None:
    name = "an-organisation/a-model-too-long-for-it"  # under the column's max_width: whole
    lines = render(models_table(name, "tiny-b", caption="a caption long enough to wrap at thirty cells"), 30)
    assert all(cell_len(line) <= 30 for line in lines), lines
    text = "\n".join(lines)
    assert "Model:" in text and "Descriptor:" in text and "Rows:" in text
    assert "".join(text.split()).count(name) == 1  # whole, folded at the terminal's edge at worst
    assert "" in lines  # rows apart


def test_cut_text_stays_on_one_line_and_wrapped_text_keeps_every_word() -> None:
    columns = [Column("Path", fit=Fit.MIDDLE), Column("Completion", fit=Fit.CUT, max_width=20),
               Column("Problem", fit=Fit.WRAP)]  # fmt: skip
    table = FittedTable(None, columns)
    problem = "the row was edited: run `judgestore delete --input-hash 907f963f` to recompute it"
    table.add_row("a/b.db", "word " * 100, problem)
    lines = render(table, 80)
    assert all(cell_len(line) <= 80 for line in lines)
    assert sum("word" in line for line in lines) == 1  # cut, with an ellipsis, on the row's first line
    assert "judgestore delete --input-hash 907f963f" in " ".join(" ".join(lines).split())


def test_wrapped_text_never_breaks_a_word_and_becomes_a_list_before_it_would() -> None:
    digest = "71c6f6597329328eba599e4d2891520a84a35206162805eb569b71ebd43e18c2"
    columns = [Column("Path", fit=Fit.PATH), Column("Kind"), Column("Problem", fit=Fit.WRAP)]
    table = FittedTable(None, columns)
    table.add_row("judgements/arena-hard/vllm/judge-1/3f985e90331ccb86/judgements.db", "input-hash",
                  f"row {digest} was edited: delete it with `judgestore delete --input-hash {digest}`")  # fmt: skip
    for width in (80, 160):  # a list (a path of 48 cells, and the digest's 64, do not fit side by side), a table
        lines = render(table, width)
        assert all(cell_len(line) <= width for line in lines), lines
        assert sum(digest in line for line in lines) == 2, lines  # each whole, on one line, to be copied
        assert ("Problem: row" in "\n".join(lines)) is (width == 80)


def test_a_long_listing_reads_the_same_in_a_pipe_as_on_a_colour_terminal_without_its_colours() -> None:
    """Without colours each line is written as one plain segment (thousands of databases): the same text."""
    names = [f"org/model-{i}-" + "x" * (i % 40) for i in range(300)]  # long enough for the line-by-line path
    for width in (200, 60, 30):  # boxed, borderless, a list of blocks
        piped = render(models_table(*names, caption="300 databases"), width)
        colour = Console(width=width, record=True, color_system="truecolor", file=open("/dev/null", "w"))  # noqa: SIM115
        colour.print(models_table(*names, caption="300 databases"))
        assert piped == colour.export_text(styles=False).splitlines()
        assert len(piped) > 300 and all(cell_len(line) <= width for line in piped)


def test_a_row_added_after_printing_is_measured_with_the_others() -> None:
    table = models_table("tiny-a", "tiny-b")
    before = render(table, 120)
    table.add_row(Text("a-model-with-a-longer-name"), "0" * 16, "3")
    after = render(table, 120)
    assert not any("a-model-with" in line for line in before)
    assert any("│ a-model-with-a-longer-name │" in line for line in after)  # whole: the column widened
    assert len(after[2]) > len(before[2])  # the header's border grew with the column
