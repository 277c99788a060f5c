"""Names in summary.md: node, tensor, op and file names come from the user's model and data, so they
are text to show, never Markdown or HTML to run.

Why its own module: summary.py and diagnosis.py both put names into Markdown. A backtick in a name
would close its code span and let raw HTML through; `|` splits a table cell and a newline ends a
table row. report.html escapes through its template engine; this is the Markdown counterpart.
"""

from __future__ import annotations

import html
import re

_BREAKS = re.compile(r"[\r\n\u2028\u2029\x00-\x08\x0b\x0c\x0e-\x1f]+")


def code(name: object) -> str:
    """`name` as an inline code span: HTML inside it is literal; the fence is longer than any run of
    backticks in the name (CommonMark), `|` is escaped (GFM splits table cells before code spans), and
    line breaks become spaces."""
    value = _BREAKS.sub(" ", str(name)).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest or value.startswith(" ") or value.endswith(" ") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def text(value: object) -> str:
    """`value` as Markdown text in a line or table cell: HTML escaped (no tag of a name is ever HTML),
    `|` backslashed, line breaks made spaces. Backticks may open a code span, where the escaped HTML
    stays literal; Markdown emphasis in a name is left alone (cosmetic, never markup that runs)."""
    return html.escape(_BREAKS.sub(" ", str(value)), quote=False).replace("|", "\\|")
