"""Stored text in a page: markdown without raw HTML, inputs read back as turns, snippets of a prefix."""

from __future__ import annotations

from store.browse.render import MARKDOWN_CHARS, NUL_SHOWN, clipped, input_snippet, markdown, messages
from store.descriptor import render_messages, render_text


def test_raw_html_in_markdown_comes_out_as_text() -> None:
    html = markdown("Hi <script>alert(1)</script> <img src=x onerror=alert(1)>\n\n<div onclick='x'>block</div>")
    assert "<script" not in html and "<img" not in html and "<div" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_markdown_renders_code_tables_and_safe_links_only() -> None:
    html = markdown(
        "```python\nprint('<b>')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "[ok](https://example.org) [bad](javascript:alert(1)) ![pic](http://tracker.example/p.png)"
    )
    assert '<pre><code class="language-python">print(' in html and "&lt;b&gt;" in html
    assert "<table>" in html and "<td>1</td>" in html
    assert '<a href="https://example.org" rel="nofollow noopener noreferrer">ok</a>' in html
    assert "javascript:" not in html.split("[bad]")[0] and 'href="javascript' not in html
    assert "<img" not in html  # a stored image would make the browser fetch the URL a prompt chose
    assert "![pic](http://tracker.example/p.png)" in html and 'tracker.example/p.png"' not in html  # text, no link


def test_text_nested_deeper_than_the_parser_goes_is_shown_whole() -> None:
    """markdown-it drops, silently, what is nested deeper than its limit: such text is shown as stored."""
    deep_list = "".join("  " * i + f"- step{i}\n" for i in range(12))
    deep_quote = ">" * 30 + " the <b>quote</b>"
    for text in (deep_list, deep_quote):
        html = markdown(text)
        assert html.startswith('<pre class="text">') and "<b>" not in html
    assert all(f"step{i}" in markdown(deep_list) for i in range(12))
    assert "the &lt;b&gt;quote&lt;/b&gt;" in markdown(deep_quote)
    assert "<ul>" in markdown("- a\n  - b\n    - c\n")  # nesting markdown-it renders stays markdown


def test_text_longer_than_the_markdown_budget_is_shown_as_stored() -> None:
    """An answer degenerated into brackets took the parser seconds (200,000 '[' about 5 s): past the budget the
    text is shown escaped, as stored; up to it, markdown."""
    degenerate = "**a** <b>\x00" + "[" * MARKDOWN_CHARS
    html = markdown(degenerate)
    assert html == f'<pre class="text">**a** &lt;b&gt;{NUL_SHOWN}{"[" * MARKDOWN_CHARS}</pre>'
    within = degenerate[:MARKDOWN_CHARS]
    assert markdown(within).startswith("<p><strong>a</strong> &lt;b&gt;")


def test_inputs_read_back_as_turns() -> None:
    chat = render_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert [(t.role, t.content) for t in messages(chat)] == [
        ("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"), ("user", "Bye"),
    ]  # fmt: skip
    assert [(t.role, t.content) for t in messages(render_text("plain <b>"))] == [("prompt", "plain <b>")]
    assert [(t.role, t.content) for t in messages("not json {")] == [("input", "not json {")]


def test_the_snippet_of_an_input_is_its_first_question_decoded_from_a_prefix() -> None:
    chat = render_messages([{"role": "system", "content": "You judge."}, {"role": "user", "content": 'Is "x" 🙂?'}])
    assert input_snippet(chat) == 'Is "x" 🙂?'
    assert input_snippet(chat[: chat.index("Is ") + 3]) == "Is "  # the prefix ends inside the question
    assert input_snippet(chat[: chat.index('"role":"system"')]) == "You judge."  # its role not seen yet
    assert input_snippet(chat[: chat.index("🙂") + 1]) == 'Is "x" 🙂'
    assert input_snippet(render_text("a text prompt")) == "a text prompt"
    assert input_snippet('{"messages":[{"content":"cut \\ud83d') == "cut "  # half a surrogate pair is dropped


def test_long_texts_are_clipped_saying_how_much() -> None:
    assert clipped("abc", 5) == ("abc", 0)
    assert clipped("abcdef", 4) == ("abcd", 2)
