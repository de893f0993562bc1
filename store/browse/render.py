"""Stored text as the browser shows it: markdown rendered safely, rendered inputs read back as turns, snippets.

Contract:

* Every stored string is untrusted (prompts come from benchmarks and users,
  completions from models). :func:`markdown` renders markdown with
  markdown-it-py's CommonMark parser (plus tables and strikethrough) with raw
  HTML *off*: a ``<script>`` in a completion comes out as the text
  ``&lt;script&gt;``; links keep only the schemes markdown-it allows (no
  ``javascript:``) and open nothing by themselves; images are not rendered
  (a stored ``![](http://...)`` would make the browser fetch a URL the
  prompt chose), their markdown stays as text (neither image nor link).
  Code blocks are ``<pre><code>``, escaped. Text nested deeper than
  markdown-it's limit (which drops the rest), or longer than
  ``MARKDOWN_CHARS`` (the parser's time grows faster than the text), is
  shown whole, escaped, in a ``<pre>``. Its output is the only HTML the
  templates insert unescaped.
* :func:`messages` reads a rendered input (``{"type":"messages",...}`` or
  ``{"type":"text",...}``, :mod:`store.descriptor`) back into turns; a value
  that is neither is shown whole as one turn.
* :func:`input_snippet` gives the first characters of the first message that
  is not a system prompt, from the *start* of a rendered input (the rows
  page reads only a prefix of each input), decoding the JSON string as far
  as it goes.
* :func:`clipped` bounds what a page shows of one text (a completion may be
  tens of megabytes), saying how much was left out.
* A stored U+0000 is shown as ``␀`` (U+2400), in markdown too (:func:`shown`,
  every value a template prints): a browser drops the character itself, and
  markdown turns it into U+FFFD. A bidirectional embedding, override or
  isolate is shown as its escape (``\u202e``): it would reorder the page's
  own text after it (a count beside a model's name read backwards).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from markupsafe import Markup

SHOWN_CHARS = 200_000  # the most of one text a page shows
# The longest text rendered as markdown. The parser's time grows faster than the text where brackets pile up (an
# answer that degenerates into "[[[..." at max_tokens: 200,000 characters took 5-7 s, 20,000 about 0.3-0.5 s).
MARKDOWN_CHARS = 20_000
SNIPPET_CHARS = 160


NUL_SHOWN = "\u2400"  # ␀, what a page shows for a stored U+0000
# Embeddings, overrides and isolates reorder what follows them up to the end of its paragraph, the page's own text
# included: a model named "m\u202e" showed its row count "17" as "71". The marks (U+200E, U+200F, U+061C) only
# place the characters beside them, as right-to-left text needs: those are kept.
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")
_MAX_NESTING = 20  # markdown-it's own limit (CommonMark preset): what is nested deeper is dropped


@functools.cache
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False, "maxNesting": _MAX_NESTING})
    md.enable(["table", "strikethrough"])

    def image(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        # Never an <img>: the browser would fetch a URL the stored text chose. Its markdown stays text.
        token = tokens[idx]
        return str(Markup("![{}]({})").format(token.content, token.attrGet("src") or ""))

    md.add_render_rule("image", image)

    def link_open(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("rel", "nofollow noopener noreferrer")
        return renderer.renderToken(tokens, idx, options, env)  # type: ignore[no-any-return]

    md.add_render_rule("link_open", link_open)
    return md


def markdown(text: str) -> Markup:
    """``text`` rendered as markdown, every piece of raw HTML escaped (see the module docstring)."""
    if len(text) > MARKDOWN_CHARS:
        return _as_stored(text)
    parser = _parser()
    tokens = parser.parse(text.replace("\x00", NUL_SHOWN))
    if any(token.level >= _MAX_NESTING - 1 for token in tokens):
        # markdown-it drops, without a word, what is nested deeper than its limit (a list ten levels deep, a
        # quote of twenty '>'): the text is shown as it is stored instead.
        return _as_stored(text)
    return Markup(parser.renderer.render(tokens, parser.options, {}))


def _as_stored(text: str) -> Markup:
    """``text`` escaped, its line breaks and spaces kept: what :func:`markdown` shows of a text it does not render."""
    return Markup('<pre class="text">{}</pre>').format(text.replace("\x00", NUL_SHOWN))


class Typed(str):
    """A form field's value as the user typed it (the ``typed`` filter): shown with its bidirectional controls as
    they are, so that the form sends back what was asked (an input box keeps their reordering to itself)."""


def shown(value: Any) -> Any:
    """A value as a template prints it (Jinja's ``finalize``): text with each U+0000 as ``␀`` and each bidirectional
    embedding, override or isolate as its escape (``\\u202e``), as the command line's tables show them; a
    :class:`Typed` value keeps those controls."""
    if not isinstance(value, str):
        return value
    typed = isinstance(value, Typed)
    value = value.replace("\x00", NUL_SHOWN)
    if typed or _BIDI_CONTROLS.search(value) is None:
        return value
    escaped = _BIDI_CONTROLS.sub(lambda found: f"\\u{ord(found.group()):04x}", value)
    return Markup(escaped) if isinstance(value, Markup) else escaped  # re.sub makes a str of a Markup


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of a rendered input: its role and text."""

    role: str
    content: str


def messages(input_text: str) -> list[Turn]:
    """The turns of a rendered input (see the module docstring)."""
    try:
        value = json.loads(input_text)
    except ValueError:
        return [Turn("input", input_text)]
    if isinstance(value, dict) and value.get("type") == "text" and isinstance(value.get("text"), str):
        return [Turn("prompt", value["text"])]
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        turns = []
        for message in value["messages"]:
            if not isinstance(message, dict):
                return [Turn("input", input_text)]
            content = message.get("content")
            if not isinstance(content, str):  # multi-part content: shown as the JSON it is
                content = json.dumps(content, ensure_ascii=False, indent=2)
            turns.append(Turn(str(message.get("role", "?")), content))
        return turns
    return [Turn("input", input_text)]


_FIRST_TEXT = re.compile(r'"(?:content|text)":"')
_JSON_STRING_PART = re.compile(r'(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def input_snippet(prefix: str, limit: int = SNIPPET_CHARS) -> str:
    """The first non-system message's text (else the first), from the start of a rendered input.

    Rendered inputs are canonical JSON with sorted keys, so a message's
    ``content`` comes before its ``role``; the prefix may end anywhere.
    """
    first = None
    for found in _FIRST_TEXT.finditer(prefix):
        body = _JSON_STRING_PART.match(prefix, found.end())
        assert body is not None  # the pattern matches the empty string
        text: str = json.loads(f'"{body.group(0)}"')
        text = _LONE_SURROGATE.sub("", text)[:limit]  # the prefix may end between the two halves of a pair
        if first is None:
            first = text
        if not prefix.startswith('","role":"system"', body.end()):
            return text
    return first if first is not None else prefix[:limit]


def clipped(text: str, limit: int = SHOWN_CHARS) -> tuple[str, int]:
    """``text`` cut to ``limit`` characters, and how many were left out."""
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit
