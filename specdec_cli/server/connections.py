"""Connections a server holds: at most `max_connections` at once, and none that sends its headers too slowly.

uvicorn keeps every connection it accepts for as long as the client likes until a request's headers are whole (a
client that sends half a request line, or nothing, holds its socket and a place in the event loop forever), and
counts connections against `limit_concurrency` only once a request is whole. So the HTTP protocol here is
uvicorn's h11 protocol with two rules of its own:
- a connection past `max_connections` is answered 503 and closed as it is accepted (cheap: nothing is parsed);
- a connection waiting for a request's headers (its first, or the next on a kept-alive connection after bytes of it
  arrived) is closed after `timeout` seconds; the body's own deadline is the app's (app.py: 408).
An idle kept-alive connection is still uvicorn's own (`timeout_keep_alive`). Nothing here reads bodies or knows
the API: `protocol_class(max_connections, timeout)` is what `uvicorn.Config(http=...)` takes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n%s")
BUSY_BODY = (b'{"error": {"message": "the server holds as many connections as it takes (--max-connections); '
             b'retry later", "type": "server_error", "param": null, "code": "too_many_connections"}}')


def protocol_class(max_connections: int, timeout: float) -> type:
    """uvicorn's h11 protocol with a connection limit and a deadline for request headers."""

    class LimitedH11Protocol(H11Protocol):
        _header_deadline: Optional[asyncio.TimerHandle] = None  # set while a request's headers are awaited

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(BUSY % (len(BUSY_BODY), BUSY_BODY))
                transport.close()
                return
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._waiting_for_headers():
                if self._header_deadline is None:
                    self._await_headers()
            else:
                self._headers_arrived()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            self._headers_arrived()
            super().connection_lost(exc)

        def _waiting_for_headers(self) -> bool:
            """Bytes of a request arrived, its headers not yet whole (h11 still in IDLE on the client's side)."""
            return self.conn.their_state is h11.IDLE and bool(self.conn.trailing_data[0])

        def _await_headers(self) -> None:
            self._header_deadline = self.loop.call_later(timeout, self._too_slow)

        def _headers_arrived(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _too_slow(self) -> None:
            self._header_deadline = None
            answering = self.cycle is not None and not self.cycle.response_complete
            if self.conn.their_state is h11.IDLE and not answering and not self.transport.is_closing():
                self.transport.close()

    return LimitedH11Protocol
