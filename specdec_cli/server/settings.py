"""What `specdec serve` (specdec's engine) is made from: the chat session's settings, where it listens, and the
server's own.

`ServerSettings` holds a `ChatSettings` whole (the target, the drafter, the generation settings for what a request
leaves out, the answer memory) and a `ListenSettings` (listen.py: host, loopback by default; port, 8080 as
llama-server's; the API key, else SPECDEC_API_KEY's), and keeps its own: the queue's length, the connections it
holds at once, how long a request may take to arrive (`--timeout`, llama-server's name), the largest request body,
the model name it lists, the web origins whose pages may call it (CORS: none unless `--cors-origins` names them; `*`
only where no one else can reach the server, or with a key). `check` runs before the model loads. Plain data:
nothing here loads or listens.

The answer memory of a server: every answer is kept on disk under $SPECDEC_HOME and drafts for every later
request, whoever sends it (a client may see another's text among a draft's sources, `timings.draft_sources`). So
`memory_default` turns it on only for a server on this machine without a key, where one person is its only user;
`--memory` asks for it anywhere.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..defaults import (
    DEFAULT_DRAFTER,
    DEFAULT_SERVE_MAX_CONNECTIONS,
    DEFAULT_SERVE_PARALLEL,
    DEFAULT_SERVE_QUEUE,
    DEFAULT_SERVE_TIMEOUT,
    MAX_SERVE_QUEUE,
)
from ..errors import SpecdecError
from ..listen import ListenSettings
from ..session.chat import ChatSettings
from ..session.run_settings import run_settings

API_KEY_ENV = "SPECDEC_API_KEY"  # the key, kept out of `ps`
MAX_BODY_BYTES = 8 * 1024 * 1024  # one request body, at most
MAX_CONNECTIONS = 65536
MAX_PARALLEL = 8  # requests answered together: 8 share a forward's 32 row-invariant rows, 3 draft tokens each


@dataclass(frozen=True)
class ServerSettings:
    chat: ChatSettings = field(default_factory=ChatSettings)
    listen: ListenSettings = field(default_factory=ListenSettings)
    queue: int = DEFAULT_SERVE_QUEUE  # requests that may wait behind the one being answered
    max_body_bytes: int = MAX_BODY_BYTES
    model_name: Optional[str] = None  # what /v1/models lists (None: the target's name); any name is served
    max_connections: int = DEFAULT_SERVE_MAX_CONNECTIONS  # connections held at once; more are answered 503 and closed
    timeout: float = DEFAULT_SERVE_TIMEOUT  # seconds for a request's headers to arrive, then as long for its body
    cors_origins: tuple[str, ...] = ()  # web origins whose pages may call the server ("*": any); none by default
    parallel: Optional[int] = None  # requests answered together, their steps in one forward (slots.py); None: auto

    def check(self) -> None:
        """Everything checkable before the model loads."""
        self.listen.check()
        if not 1 <= self.queue <= MAX_SERVE_QUEUE:
            raise SpecdecError(f"queue must be in 1..{MAX_SERVE_QUEUE} (requests waiting behind the one answered), got "
                               f"{self.queue}", setting="queue")
        if self.parallel is not None and not 1 <= self.parallel <= MAX_PARALLEL:
            raise SpecdecError(f"parallel must be in 1..{MAX_PARALLEL} (requests answered together), got "
                               f"{self.parallel}", setting="parallel")
        if not 1 <= self.max_connections <= MAX_CONNECTIONS:
            raise SpecdecError(f"max_connections must be in 1..{MAX_CONNECTIONS}, got {self.max_connections}",
                               setting="max_connections")
        if not (math.isfinite(self.timeout) and 0 < self.timeout <= 86400):
            raise SpecdecError(f"timeout must be a number of seconds in (0, 86400], got {self.timeout}",
                               setting="timeout")
        check_origins(self.cors_origins, self.open_to_others)
        if self.max_body_bytes < 1024:
            raise SpecdecError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}", setting="max_body_bytes")
        self.chat.check()

    @property
    def open_to_others(self) -> bool:
        """Whether the server listens beyond this machine without a key."""
        return not self.listen.loopback and not self.listen.api_key


def check_origins(origins: tuple[str, ...], open_to_others: bool) -> None:
    """CORS origins: `*`, or scheme://host[:port] each (what a browser sends as Origin); `*` is refused on a server
    others reach without a key, where any web page anyone opens could use it."""
    import re

    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+", origin):
            raise SpecdecError(f"cors_origins: {origin!r} is not an origin (scheme://host[:port], no path; or *)",
                               setting="cors_origins")
    if "*" in origins and open_to_others:
        raise SpecdecError("cors_origins *: any web page could use a server others reach without a key; give "
                           "--api-key, listen on 127.0.0.1, or name the origins", setting="cors_origins")


def parallel_setting(value: str) -> Optional[int]:
    """`--parallel`'s value: `auto` (None: `slots.slots_for` decides once the model is loaded) or a count."""
    text = str(value).strip().lower()
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise SpecdecError(f"parallel must be auto or a count in 1..{MAX_PARALLEL} (requests answered together), got "
                           f"{value!r}", setting="parallel") from None


def memory_default(listen: ListenSettings) -> bool:
    """Whether a server keeps answers when not told: only on this machine without a key (one user, its own)."""
    return listen.loopback and not listen.api_key


def server_settings(*, queue: int = DEFAULT_SERVE_QUEUE, model_name: Optional[str] = None,
                    system: Optional[str] = None, remember: Optional[bool] = None, drafter: Optional[str] = None,
                    host: Optional[str] = None, port: Optional[int] = None, api_key: Optional[str] = None,
                    max_connections: int = DEFAULT_SERVE_MAX_CONNECTIONS, timeout: float = DEFAULT_SERVE_TIMEOUT,
                    cors_origins: tuple[str, ...] = (), parallel: str = DEFAULT_SERVE_PARALLEL,
                    **values: Any) -> ServerSettings:
    """The flags as checked ServerSettings; `values` are named as the run settings' fields (run_settings.py). The
    key, when not given, is SPECDEC_API_KEY's (set but empty: refused); `remember` None: `memory_default`."""
    if api_key is None and API_KEY_ENV in os.environ:
        api_key = os.environ[API_KEY_ENV]
        if not api_key.strip():
            raise SpecdecError(f"{API_KEY_ENV} is set but empty: unset it or give a key")
    listen = ListenSettings(api_key=api_key)
    listen = replace(listen, host=listen.host if host is None else host, port=listen.port if port is None else port)
    run = run_settings(DEFAULT_DRAFTER if drafter is None else drafter.strip().lower(), **values)
    if remember is None:
        remember = memory_default(listen)
    settings = ServerSettings(ChatSettings(run, system=system, remember=remember), listen, queue=queue,
                              model_name=model_name, max_connections=max_connections, timeout=timeout,
                              cors_origins=tuple(cors_origins), parallel=parallel_setting(parallel))
    settings.check()
    return settings
