"""Text that came from a file, made inert for where it goes: Markdown (`code_fence`, `code_span`,
`markdown_text`), CSV (`csv_cell`), a number only when it is one (`number_text`, `is_number`); a
terminal's is zoo.guards.errors.printable. Why: docs/design-notes.md, "Inert text".
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
    """`value` formatted with `spec` when a finite number, `missing` for None, else its escaped text."""
    if value is None:
        return missing
    if is_number(value) and math.isfinite(value):
        return format(value, spec)
    text = printable(value if isinstance(value, str) else repr(value))
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def markdown_text(text) -> str:
    """`text` for Markdown outside a fence: one line, HTML-escaped, Markdown's punctuation escaped."""
    text = _MARKDOWN_PUNCTUATION.sub(r"\\\1", html.escape(printable(text), quote=False))
    return _BLOCK_START.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


def _ticks(text: str) -> int:
    return max((len(run) for run in re.findall(r"`+", text)), default=0)


def code_fence(text: str, info: str = "") -> list[str]:
    """`text` as a fenced code block, the fence longer than any backtick run in it."""
    lines = [printable(line) for line in str(text).split("\n")]
    fence = "`" * max(3, _ticks("\n".join(lines)) + 1)
    return [fence + info, *lines, fence]


def code_span(text) -> str:
    """`text` as inline code, delimited by more backticks than any run in it."""
    text = printable(text)
    ticks = "`" * (_ticks(text) + 1)
    # CommonMark strips one space from each end of a span that has one at both: a pad keeps them
    pad = " " if text[:1] == "`" or text[-1:] == "`" or (text[:1] == text[-1:] == " " and text.strip()) else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def csv_cell(value):
    """A CSV cell: text escaped, a leading apostrophe where a spreadsheet would see a formula (OWASP)."""
    if not isinstance(value, str):
        return value
    text = printable(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
