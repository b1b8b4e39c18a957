"""Starting the server: load the model (a chat session), start the worker, run uvicorn until stopped.

`serve(settings)` binds the address first (a port taken, or taken by a second server started at the same moment,
is one line before the model loads: the socket is held from that check until uvicorn serves on it), then blocks
until Ctrl-C or SIGTERM (uvicorn's handlers; the running generation is cut at its next step and its client told,
so shutting down waits for no answer; both are a normal stop, `serve` returns the signal's name). `Server` is the
same server around a session already open, run in a thread (`start`/`stop`): how the tests and the benchmark drive
one in-process. Logging goes to the `specdec.server` logger (a generation's traceback) and uvicorn's, both left to
the root logger's handlers; the CLI decides where they show.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Optional

from ..errors import SpecdecError
from .settings import ServerSettings

GRACE_SECONDS = 3  # how long stopping waits for open connections after every job was cancelled
# While serving, a thread that wants Python's lock gets it after this long (Python's default: 5 ms). The generating
# thread runs Python between its kernels' calls, and the HTTP thread's streaming holds the lock in between: at the
# default, 4 streams answered together ran 237 tok/s on the default model; at 0.1 ms, 327 (one stream: 174 and
# 181). Measured 2026-11-29, 2-core Intel Xeon, benchmarks/bench_serve.py --clients 4 (docs/serve.md).
SWITCH_INTERVAL = 1e-4


class Server:
    """One session served over HTTP: the worker thread and uvicorn."""

    def __init__(self, session: Any, settings: ServerSettings, model_name: str, sock: Optional[Any] = None):
        import uvicorn

        try:  # the event loop's backend for streamed responses, imported by the first stream (~50 ms) otherwise
            import anyio._backends._asyncio  # noqa: F401
        except ImportError:  # (a later anyio may keep it elsewhere: then the first stream imports it)
            pass

        from .app import build_app
        from .connections import protocol_class
        from .slots import slots_for
        from .worker import Worker

        self.settings = settings
        self.model_name = settings.model_name or model_name
        self.worker = Worker(session, settings.queue, slots_for(settings.parallel, session))
        self.app = build_app(self.worker, settings, self.model_name)
        # log_config None: uvicorn's records go to the root logger as specdec's own do (the CLI sets its format)
        config = uvicorn.Config(self.app, host=settings.listen.host, port=settings.listen.port, log_level="warning",
                                log_config=None, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=GRACE_SECONDS,
                                http=protocol_class(settings.max_connections, settings.timeout))
        server, worker = self, self.worker
        self.signal: Optional[str] = None  # the signal that stopped `run`

        class Uvicorn(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                import signal

                server.signal = signal.Signals(sig).name
                worker.stop_soon()  # the running answer stops at its next step, waiting ones at once
                super().handle_exit(sig, frame)
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list):  # uvicorn would raise it again once stopped: a stop is no error here
                    captured.clear()

        self.uvicorn = Uvicorn(config)
        self.sockets = [sock] if sock is not None else None
        self._thread: Optional[threading.Thread] = None
        self._switch_interval = sys.getswitchinterval()  # Python's, put back when the server stops

    @property
    def url(self) -> str:
        host = self.settings.listen.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def port(self) -> int:
        servers = getattr(self.uvicorn, "servers", None) or []
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self.settings.listen.port

    def run(self) -> Optional[str]:
        """Serve in this thread until a signal stops uvicorn; the signal's name."""
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.worker.start()
        try:
            self.uvicorn.run(sockets=self.sockets)
        finally:
            self.worker.stop()
            sys.setswitchinterval(self._switch_interval)
        return self.signal

    def start(self, timeout: float = 60.0) -> "Server":
        """Serve in a background thread; returns once the socket listens."""
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL)
        self.worker.start()
        # uvicorn installs signal handlers only in the main thread: this one leaves them alone
        self._thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": self.sockets},
                                        name="specdec-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.worker.stop_soon()
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.worker.stop()
        sys.setswitchinterval(self._switch_interval)


def listening_socket(host: str, port: int) -> Any:
    """A socket bound to the address and listening, or one line saying why it cannot be (taken, not this
    machine's). Held until uvicorn serves on it, so two servers started together cannot both pass."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise SpecdecError(f"--host {host}: {error.strerror or error}", setting="host") from None
    family, kind, protocol, _, address = infos[0]
    sock = socket.socket(family, kind, protocol)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT only, never shared
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise SpecdecError(f"cannot listen on {host}:{port}: {error.strerror or error}", setting="port") from None
    sock.set_inheritable(True)
    return sock


def serve(settings: ServerSettings, on_status: Optional[Callable[[str], None]] = None,
          on_ready: Optional[Callable[[Server, Any], None]] = None) -> Optional[str]:
    """Check the settings, bind the address, load the target, and serve until stopped; the signal that stopped
    it (SIGINT, SIGTERM)."""
    from ..heap import settle_heap
    from ..session.chat import open_session

    settings.check()
    sock = listening_socket(settings.listen.host, settings.listen.port)  # in the first second, not after the load
    try:
        session, loaded = open_session(settings.chat, on_status)
        settle_heap()  # (what loading left alive, out of the collections that would pause answers)
        server = Server(session, settings, loaded.name, sock)
        if on_ready is not None:
            on_ready(server, loaded)
        return server.run()
    finally:
        sock.close()
