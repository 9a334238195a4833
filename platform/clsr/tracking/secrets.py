"""Keep credentials out of what the platform logs and prints.

``mask_uri`` replaces the secrets inside every URI of a text with ``***``: the password of a
``user:password@host`` part (``http://user:***@host:5000``, ``postgresql://user:***@host/db``), and the
value of query parameters whose names look like secrets (``?token=***``, ``X-Amz-Signature=***``).
Apply it to any text that may hold a tracking URI or a storage URI before it is logged, stored as an
artifact or a tag, or shown in an error.
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://user:secret@ : the secret runs up to the last '@' before the host (no '/', '?', '#' or space).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@'\"]*:)(?P<secret>[^\s/?#'\"]*)@")
_SECRET_NAMES = (
    r"[A-Za-z0-9_\-.]*(?:token|password|passwd|pwd|secret|key|signature|credential|sig|auth)[A-Za-z0-9_\-.]*"
)
# ?name=value or &name=value, name matched case-insensitively; the value runs to the next '&', '#' or space.
_QUERY = re.compile(rf"(?P<head>[?&;](?i:{_SECRET_NAMES})=)(?P<secret>[^&#\s'\"]*)")


def mask_uri(text: str) -> str:
    """``text`` with the password (or token) of every URI's user part and secret-looking query values
    replaced by ``***``; everything else (scheme, user, host, port, path, other parameters) is kept."""
    if not text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}@" if m["secret"] else m[0], text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}" if m["secret"] else m[0], text)
