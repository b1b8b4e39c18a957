"""Which bench rows are llama.cpp's server, and where its binary is: the row names (`llama-server`,
`llama-server:TYPE`, `http://HOST:PORT`) parsed and checked, and the `llama-server` binary found on PATH or at
--llama-server PATH. Plain string and path work: nothing here starts a process or opens a connection
(llama_server.py does; llama_server_http.py speaks to a server).
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from typing import Optional

from ..errors import SpecdecError

LLAMA_SERVER = "llama-server"
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")  # llama.cpp's n-gram --spec-type values offered here
INSTALL = "`make install-llama-server` builds it into .venv/bin, or pass --llama-server PATH"


def is_server_name(name: str) -> bool:
    """`llama-server`, `llama-server:TYPE` or a URL (http://HOST:PORT)."""
    return name == LLAMA_SERVER or name.startswith(LLAMA_SERVER + ":") or is_url(name)


def is_url(name: str) -> bool:
    return name.startswith(("http://", "https://"))


def parse_url(text: str) -> tuple[str, str]:
    """'http://host:port[/]' -> (base URL without a trailing slash, row name `llama-server@host:port`)."""
    parsed = urllib.parse.urlsplit(text)
    bad = SpecdecError(f"--reference {text}: a llama.cpp server's address is http://HOST:PORT (e.g. "
                       "http://127.0.0.1:8080)", setting="reference")
    try:
        port = parsed.port
    except ValueError:
        raise bad from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/") or \
            parsed.query or parsed.fragment:
        raise bad
    port = port or (443 if parsed.scheme == "https" else 80)
    host = parsed.hostname
    shown = f"[{host}]" if ":" in host else host
    return f"{parsed.scheme}://{shown}:{port}", f"{LLAMA_SERVER}@{shown}:{port}"


def spec_type_of(name: str) -> str:
    """`llama-server:ngram-mod` -> 'ngram-mod'; `llama-server` -> '' (plain decoding)."""
    return name.split(":", 1)[1] if name.startswith(LLAMA_SERVER + ":") else ""


def find_binary(explicit: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(path of the llama-server binary, None) or (None, why there is none). A --llama-server PATH that is not
    an executable file is a user's mistake: SpecdecError."""
    if explicit:
        path = os.path.expanduser(explicit)
        if os.path.isdir(path):
            raise SpecdecError(f"llama_server: {explicit} is a directory, not the llama-server binary",
                               setting="llama_server")
        if not os.path.isfile(path):
            raise SpecdecError(f"llama_server: no such file: {explicit}", setting="llama_server")
        if not os.access(path, os.X_OK):
            raise SpecdecError(f"llama_server: {explicit} is not executable", setting="llama_server")
        return os.path.abspath(path), None
    found = shutil.which(LLAMA_SERVER)
    if found is None:
        return None, f"no {LLAMA_SERVER} binary on PATH ({INSTALL})"
    return found, None

