"""Rule 5: whatever is read from the record is escaped for where it is written.

A tag, param, metric name or label in MLflow is anyone's to write on a shared tracking server, so each
output format gets its own escape: the terminal (no control character reaches it: an ESC would start an
OSC 52 clipboard write or rewrite the screen), CSV (no cell a spreadsheet takes for a formula), Markdown
(no cell a ``|`` or a line break splits, no HTML), HTML, and matplotlib's labels (no mathtext ``$``).
"""

from __future__ import annotations

import html
import re

# C0 and C1 controls, DEL, and the bidirectional overrides that reorder what a reader sees
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_KEPT_ON_TERMINAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _visible(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]  # ESC as the four characters \x1b: seen, never obeyed


def visible(text: str) -> str:
    """Every control character (line breaks too) as its escape sequence: one value on one line."""
    return _CONTROL.sub(_visible, str(text))


def terminal(text: str) -> str:
    """Text for the terminal: control characters shown as escapes, the output's own line breaks and
    tabs kept (record values never carry theirs this far: cells are split into lines before)."""
    return _KEPT_ON_TERMINAL.sub(_visible, str(text))


def csv_cell(value: object) -> object:
    """A CSV cell a spreadsheet shows as text: a string starting like a formula gets a leading quote
    (OWASP's advice); numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def markdown(text: str) -> str:
    """One line of a Markdown cell or paragraph: HTML special characters as entities, a backslash, pipe
    or backtick escaped, a line break as ``<br>``, other control characters shown as escapes."""
    text = html.escape(str(text), quote=False)
    text = re.sub(r"([\\|`])", r"\\\1", text)
    return visible(text.replace("\r\n", "\n").replace("\n", "<br>"))


def html_text(text: str) -> str:
    """Text inside an HTML element or attribute (quotes escaped too), control characters shown."""
    return visible(html.escape(str(text), quote=True))


def plot_label(text: str) -> str:
    """A matplotlib label: a ``$`` is literal (no mathtext), control characters shown."""
    return visible(str(text)).replace("$", r"\$")
