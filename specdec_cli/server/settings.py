"""What `specdec serve` (specdec's engine) is made from: the chat session's settings and the server's own.

`ServerSettings` holds a `ChatSettings` (the target, the drafter, generation defaults for requests that name none,
the answer memory) and where and how the server listens: host (loopback by default), port (8080, as
llama-server), the queue's length, the API key, the largest request body. `check` runs before the model loads.
Plain data: nothing here loads or listens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ..errors import SpecdecError
from ..session.chat import ChatSettings

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080  # llama-server's
DEFAULT_QUEUE = 16  # requests waiting behind the one being answered
DEFAULT_MAX_BODY = 8 * 1024 * 1024  # bytes of one request body
API_KEY_ENV = "SPECDEC_API_KEY"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerSettings:
    chat: ChatSettings = field(default_factory=ChatSettings)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    queue: int = DEFAULT_QUEUE
    api_key: Optional[str] = None  # requests must send `Authorization: Bearer KEY`
    max_body_bytes: int = DEFAULT_MAX_BODY
    model_name: Optional[str] = None  # what /v1/models lists (default: the target's name); any name is served

    def check(self) -> None:
        """Everything checkable before the model loads."""
        if not 0 <= self.port <= 65535:
            raise SpecdecError(f"port must be between 0 and 65535, got {self.port}", setting="port")
        if self.queue < 1:
            raise SpecdecError(f"queue must be >= 1 (requests waiting behind the one answered), got {self.queue}",
                               setting="queue")
        if self.api_key is not None and not self.api_key.strip():
            raise SpecdecError(f"api_key is empty (unset {API_KEY_ENV} or give a key)", setting="api_key")
        if self.max_body_bytes < 1024:
            raise SpecdecError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}", setting="max_body_bytes")
        if not self.host.strip():
            raise SpecdecError("host is empty", setting="host")
        self.chat.check()

    @property
    def open_to_others(self) -> bool:
        """Whether anyone beyond this machine may reach the server without a key."""
        return self.host not in LOOPBACK and not self.api_key


def server_settings(*, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, queue: int = DEFAULT_QUEUE,
                    api_key: Optional[str] = None, model_name: Optional[str] = None, system: Optional[str] = None,
                    remember: bool = True, drafter: Optional[str] = None, **values: Any) -> ServerSettings:
    """The flags as checked ServerSettings; `values` are named as the run settings' fields (run_settings.py). The
    key, when not given, is SPECDEC_API_KEY's (set and empty: refused)."""
    from ..defaults import DEFAULT_DRAFTER
    from ..session.run_settings import run_settings

    if api_key is None:
        api_key = os.environ.get(API_KEY_ENV)
    run = run_settings(DEFAULT_DRAFTER if drafter is None else drafter.strip().lower(), **values)
    settings = ServerSettings(ChatSettings(run, system=system, remember=remember), host=host, port=port,
                              queue=queue, api_key=api_key, model_name=model_name)
    settings.check()
    return settings
