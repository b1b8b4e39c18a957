"""Where a server listens and who may call it: `ListenSettings` (host, port, API key), held whole by both servers'
settings (`specdec serve` on specdec's engine, server/settings.py, and on vLLM's, vllm/serve.py), and
`is_loopback`, which says whether a host is reachable from this machine only.

Plain data and checks; nothing here listens. Each server says where its key may also come from (an environment
variable of its own) and what listening beyond this machine without one means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .defaults import DEFAULT_SERVE_PORT
from .errors import SpecdecError


@dataclass(frozen=True)
class ListenSettings:
    host: str = "127.0.0.1"  # this machine only, unless asked
    port: int = DEFAULT_SERVE_PORT
    api_key: Optional[str] = None  # requests must send `Authorization: Bearer KEY` (None: anyone may call)

    def check(self) -> None:
        if not 1 <= self.port <= 65535:
            raise SpecdecError(f"port must be in 1..65535, got {self.port}", setting="port")
        if self.api_key is not None:
            if not self.api_key.strip():
                raise SpecdecError("api_key must not be empty", setting="api_key")
            if self.api_key != self.api_key.strip():
                raise SpecdecError("api_key must not begin or end with spaces (a client's header never carries "
                                   "them, so it could never match)", setting="api_key")
            if not all(" " <= char <= "~" for char in self.api_key):
                raise SpecdecError("api_key must be printable ASCII (HTTP clients send other characters in "
                                   "different encodings, so it would not match reliably)", setting="api_key")
        if not self.host.strip():
            raise SpecdecError("host must not be empty", setting="host")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # another host name: it may resolve to any interface
        return False
