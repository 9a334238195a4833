"""Keep credentials out of what the platform logs and prints.

``mask_uri`` replaces the secrets inside a text with ``***``:

* the password of every URI's ``user:password@`` part (``http://user:***@host:5000``,
  ``postgresql://user:***@host/db``). The password runs to the *last* ``@`` of the URI (the
  whitespace-delimited word, or up to the closing quote when the URI is quoted), so one holding ``/``,
  ``#``, ``?`` or ``@`` (AWS secret keys hold ``/``) is masked whole. A password with spaces runs on
  to the first word with an ``@`` on the same line, unless what follows the ``:`` is a port. Where
  that is ambiguous the mask errs towards hiding: ``http://host:5000/a@b`` is shown as
  ``http://host:***@b`` (port and path lost), while ``s3://bucket/a@b`` (no ``:`` before the first
  ``/``) is kept. A quote ends a quoted URI, so a password holding that quote is masked up to it only.
* the value of query parameters whose names look like secrets (``?token=***``, ``X-Amz-Signature=***``);
* ``password=`` (also ``passwd``, ``pwd``, ``secret``, any prefix: ``PGPASSWORD``, ``sslpassword``,
  ``aws_secret_access_key``) anywhere, as libpq's keyword form writes it (``host=db password=***``,
  ``password='quoted secret'``, ``password="double quoted"``) and error texts repeat it.

Apply it to any text that may hold a tracking URI or a storage URI before it is logged, stored as an
artifact or a tag, or shown in an error.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://user: (a user holds none of : / ? # @ [ ] quotes or spaces); the password follows.
# A scheme starts where no scheme character precedes it (not at every word boundary inside "a.b.c...":
# that made long dotted texts cost quadratic time).
_USERINFO = re.compile(
    r"(?P<quote>['\"]?)(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*+://[^\s:/?#@\[\]'\"]*:"
)
_PORT = re.compile(r"\d*(?:[/?#]\S*)?")
_NAME = r"[A-Za-z0-9_\-.]"


def _named(words: str) -> str:
    """A parameter name holding one of ``words`` (any case), matched without backtracking (``++``), so
    a long run of name characters costs linear time."""
    return rf"(?=(?i:{_NAME}*?(?:{words}))){_NAME}++"


# ?name=value or &name=value; the value runs to the next '&', '#', quote or space.
_QUERY = re.compile(
    rf"(?P<head>[?&;]{_named('token|password|passwd|pwd|secret|key|signature|credential|sig|auth')}=)"
    r"(?P<secret>[^&#\s'\"]*)"
)
# name=value anywhere else (not a query parameter): libpq's 'quoted value' with \' escapes, a "quoted
# value", or a word.
_KEYWORD = re.compile(
    rf"(?P<head>(?<![A-Za-z0-9_\-.?&;]){_named('password|passwd|pwd|secret')}[ \t]*=[ \t]*)"
    r"(?P<secret>'(?:\\.|[^'\\])*'?|\"(?:\\.|[^\"\\])*\"?|[^\s'\"]+)"
)


def mask_uri(text: str) -> str:
    """``text`` with the password (or token) of every URI's user part, secret-looking query values and
    ``password=`` values replaced by ``***``; everything else (scheme, user, host, port, path, other
    parameters) is kept (see the module doc for where a password ends)."""
    if not text:
        return text
    text = _mask_userinfo(text)
    text = _QUERY.sub(lambda m: f"{m['head']}{MASK}" if m["secret"] else m[0], text)
    return _KEYWORD.sub(lambda m: f"{m['head']}{MASK}", text)


def _mask_userinfo(text: str) -> str:
    pieces, done = [], 0
    for match in _USERINFO.finditer(text):
        start = match.end()
        if match.start() < done:  # inside a password already masked
            continue
        end = _password_end(text, start, match["quote"])
        if end is None or end == start:  # no password, or an empty one: nothing to hide
            continue
        pieces += [text[done:start], MASK]
        done = end
    return "".join(pieces) + text[done:]


def _password_end(text: str, start: int, quote: str) -> int | None:
    """Where the password that starts at ``start`` ends (its ``@``), or None when there is none."""
    stops = f"\\s{quote}" if quote else "\\s"
    word = re.match(f"[^{stops}]*", text[start:])[0]
    if "@" in word:
        return start + word.rindex("@")
    if _PORT.fullmatch(word):  # host:port[/path]: not a password
        return None
    line = re.match(f"[^\\n{quote}]*", text[start:])[0]
    at = line.find("@")
    if at < 0 or "://" in line[:at]:
        return None
    return start + at + re.match(f"[^{stops}]*", line[at:])[0].rindex("@")
