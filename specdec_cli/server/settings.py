"""What `specdec serve` (specdec's engine) is made from: the chat session's settings, where it listens, and the
server's own.

`ServerSettings` holds a `ChatSettings` whole (the target, the drafter, the generation settings for what a request
leaves out, the answer memory) and a `ListenSettings` (listen.py: host, loopback by default; port, 8080 as
llama-server's; the API key, else SPECDEC_API_KEY's), and keeps its own: the queue's length, the largest request
body, the model name it lists. `check` runs before the model loads. Plain data: nothing here loads or listens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..defaults import DEFAULT_DRAFTER, DEFAULT_SERVE_QUEUE
from ..errors import SpecdecError
from ..listen import ListenSettings
from ..session.chat import ChatSettings
from ..session.run_settings import run_settings

API_KEY_ENV = "SPECDEC_API_KEY"  # the key, kept out of `ps`
MAX_BODY_BYTES = 8 * 1024 * 1024  # one request body, at most


@dataclass(frozen=True)
class ServerSettings:
    chat: ChatSettings = field(default_factory=ChatSettings)
    listen: ListenSettings = field(default_factory=ListenSettings)
    queue: int = DEFAULT_SERVE_QUEUE  # requests that may wait behind the one being answered
    max_body_bytes: int = MAX_BODY_BYTES
    model_name: Optional[str] = None  # what /v1/models lists (None: the target's name); any name is served

    def check(self) -> None:
        """Everything checkable before the model loads."""
        self.listen.check()
        if self.queue < 1:
            raise SpecdecError(f"queue must be >= 1 (requests waiting behind the one answered), got {self.queue}",
                               setting="queue")
        if self.max_body_bytes < 1024:
            raise SpecdecError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}", setting="max_body_bytes")
        self.chat.check()

    @property
    def open_to_others(self) -> bool:
        """Whether the server listens beyond this machine without a key."""
        return not self.listen.loopback and not self.listen.api_key


def server_settings(*, queue: int = DEFAULT_SERVE_QUEUE, model_name: Optional[str] = None,
                    system: Optional[str] = None, remember: bool = True, drafter: Optional[str] = None,
                    host: Optional[str] = None, port: Optional[int] = None, api_key: Optional[str] = None,
                    **values: Any) -> ServerSettings:
    """The flags as checked ServerSettings; `values` are named as the run settings' fields (run_settings.py). The
    key, when not given, is SPECDEC_API_KEY's (set but empty: refused)."""
    if api_key is None and API_KEY_ENV in os.environ:
        api_key = os.environ[API_KEY_ENV]
        if not api_key.strip():
            raise SpecdecError(f"{API_KEY_ENV} is set but empty: unset it or give a key")
    listen = ListenSettings(api_key=api_key)
    listen = replace(listen, host=listen.host if host is None else host, port=listen.port if port is None else port)
    run = run_settings(DEFAULT_DRAFTER if drafter is None else drafter.strip().lower(), **values)
    settings = ServerSettings(ChatSettings(run, system=system, remember=remember), listen, queue=queue,
                              model_name=model_name)
    settings.check()
    return settings
