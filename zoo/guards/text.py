"""Text that came from a file (a class name, a word, a metric, a recipe's command), made inert for
where it goes: shown, never obeyed. A terminal: zoo.guards.errors.printable. Markdown: `code_fence`
(longer than any backtick run inside), `code_span`, and `markdown_text` (HTML-escaped outside fences,
Markdown's punctuation backslash-escaped). CSV: `csv_cell` (no cell a spreadsheet takes for a
formula). YAML and JSON escape with their own dumpers, HTML with `html.escape` (zoo.viz.record's
`script_json` inside a script). A metric is a number only when it is one (`number_text`, `is_number`):
anything else is its escaped text. Why: docs/design-notes.md, "Inert text".
"""
from __future__ import annotations

import html
import math
import re

from zoo.guards.errors import printable

#: characters of a file-provided value shown where a number was expected
SHOWN = 60
#: Markdown's inline syntax (emphasis, code, links and images, tables, strike-through, headings)
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]#|!~])")
#: what starts a block at the start of a line: a list item, a numbered one, a quote, a rule
_BLOCK_START = re.compile(r"^(\s*(?:\d+)?)([-+=.)])")


def is_number(value) -> bool:
    """A real number (an int or float, never a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_text(value, spec: str = ".4g", missing: str = "-") -> str:
    """`value` formatted with `spec` when it is a finite number; `missing` for None; anything else
    (a word, a list, NaN) as its escaped text, cut to SHOWN characters."""
    if value is None:
        return missing
    if is_number(value) and math.isfinite(value):
        return format(value, spec)
    text = printable(value if isinstance(value, str) else repr(value))
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def markdown_text(text) -> str:
    """`text` for Markdown outside a fence: one line (control characters escaped), HTML-escaped,
    Markdown's punctuation backslash-escaped, so it renders as the characters it holds."""
    text = _MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(printable(text), quote=False))
    return _BLOCK_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


def _ticks(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def code_fence(text: str, info: str = "") -> list[str]:
    """`text` as the lines of a fenced code block: each line's control characters escaped, and a
    fence of more backticks than any run in the text (at least three), so no line closes it."""
    lines = [printable(line) for line in str(text).split("\n")]
    fence = "`" * max(3, _ticks("\n".join(lines)) + 1)
    return [fence + info, *lines, fence]


def code_span(text) -> str:
    """`text` as inline code: one line, delimited by more backticks than any run in it (padded with
    spaces where it starts or ends with one)."""
    text = printable(text)
    ticks = "`" * (_ticks(text) + 1)
    # CommonMark strips one space from each end of a span that has one at both: a pad keeps them
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip()) else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def csv_cell(value):
    """A CSV cell: text with its control characters escaped and, where a spreadsheet would read it
    as a formula (a leading =, +, -, @), a leading apostrophe (OWASP's rule); numbers as they are."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
