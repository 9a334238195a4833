"""Whether the Hugging Face hub can be reached, asked once per process in at most a few seconds.

Why by hand: without ``HF_HUB_OFFLINE=1``, ``huggingface_hub``, ``datasets`` and ``transformers`` each
retry an unreachable hub (about 25 s for one data set) before they fall back to the local cache or fail.
A machine with no route to the hub (a compute node, an air-gapped cluster) answers one TCP connection at
once, so we ask that first and, when the hub cannot be reached, work from the local cache for the rest of
the process, exactly as ``HF_HUB_OFFLINE=1`` would, and say so once.

Behind an HTTP proxy (``HTTPS_PROXY``, ``ALL_PROXY``) a direct connection says nothing: the libraries are
left to try.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 3.0
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
TRUE_VALUES = ("1", "ON", "YES", "TRUE")
# Process state, kept where the switch itself lives: the environment. Going offline is process-wide (the
# libraries read HF_HUB_OFFLINE for the whole process, and processes started later inherit it), so why it
# happened is recorded beside it, in this variable, rather than in a module global; a worker started after
# the switch inherits the reason with the flag.
SWITCHED_ENV = "CLSR_HUB_SWITCHED_OFFLINE"


def offline_requested() -> bool:
    """The user asked for no hub traffic (read per call, as the libraries read it at import)."""
    flags = (os.environ.get(k, "").upper() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag in TRUE_VALUES for flag in flags)


def datasets_hub_off() -> str | None:
    """Why ``datasets`` will not read from the hub here: the offline flag that is set (as datasets reads
    them), or no route to the hub (a TCP connection, at most a few seconds); None: it may."""
    for flag in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(flag, "").upper() in TRUE_VALUES:
            return f"is off ({flag})"
    why = hub_unreachable()
    return f"cannot be reached ({why})" if why else None


@functools.cache
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached from here (None: it may be, or a proxy decides)."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = (
        endpoint.hostname or "huggingface.co",
        endpoint.port or (80 if endpoint.scheme == "http" else 443),
    )
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as err:
        return f"{host}:{port}: {err.strerror or type(err).__name__}"


def go_offline_if_unreachable() -> str | None:
    """When the hub cannot be reached, switch this process (and the Ray workers it starts) to the local
    cache, as ``HF_HUB_OFFLINE=1`` does; returns why, or None (offline already, or the hub may answer)."""
    if offline_requested() or (why := hub_unreachable()) is None:
        return None
    os.environ[SWITCHED_ENV] = why
    os.environ["HF_HUB_OFFLINE"] = "1"  # read by the libraries at import, and by processes started later
    # already imported: their module-level flags are what they consult on each call
    for module, name in [("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                         ("datasets.config", "HF_DATASETS_OFFLINE")]:  # fmt: skip
        if module in sys.modules:
            setattr(sys.modules[module], name, True)
    print(
        f"note: the Hugging Face hub cannot be reached ({why}): working from the local cache only, as with "
        f"HF_HUB_OFFLINE=1 (set it yourself to skip this check)",
        file=sys.stderr,
    )
    return why


def switched_offline() -> str | None:
    """Why this process (or the one that started it) switched itself to the local cache (None: it did not)."""
    return os.environ.get(SWITCHED_ENV) or None
