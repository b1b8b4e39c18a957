"""Starting the server: load the model (a chat session), start the worker, run uvicorn until stopped.

`serve(settings)` blocks until Ctrl-C or SIGTERM (uvicorn's handlers; the running generation is cancelled at its
next step, so shutting down waits for no answer). `Server` is the same server around a session already open, run
in a thread (`start`/`stop`): how the tests and the benchmark drive one in-process. Logging goes to the
`specdec.server` logger (a generation's traceback) and uvicorn's; the CLI decides where it shows.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from ..errors import SpecdecError
from .settings import ServerSettings

GRACE_SECONDS = 3  # how long stopping waits for open connections after every job was cancelled


class Server:
    """One session served over HTTP: the worker thread and uvicorn."""

    def __init__(self, session: Any, settings: ServerSettings, model_name: str):
        import uvicorn

        from .app import build_app
        from .worker import Worker

        self.settings = settings
        self.model_name = settings.model_name or model_name
        self.worker = Worker(session, settings.queue)
        self.app = build_app(self.worker, settings, self.model_name)
        config = uvicorn.Config(self.app, host=settings.listen.host, port=settings.listen.port, log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=GRACE_SECONDS)
        worker = self.worker

        class Uvicorn(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                worker.stop_soon()  # the running answer stops at its next step, waiting ones at once
                super().handle_exit(sig, frame)

        self.uvicorn = Uvicorn(config)
        self._thread: Optional[threading.Thread] = None

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

    def run(self) -> None:
        """Serve in this thread until a signal stops uvicorn."""
        self.worker.start()
        try:
            self.uvicorn.run()
        finally:
            self.worker.stop()

    def start(self, timeout: float = 60.0) -> "Server":
        """Serve in a background thread; returns once the socket listens."""
        self.worker.start()
        # uvicorn installs signal handlers only in the main thread: this one leaves them alone
        self._thread = threading.Thread(target=self.uvicorn.run, name="specdec-serve", daemon=True)
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


def check_address(host: str, port: int) -> None:
    """Refuse, in one line, an address this process cannot listen on (taken, or not this machine's)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise SpecdecError(f"--host {host}: {error.strerror or error}", setting="host") from None
    family, kind, protocol, _, address = infos[0]
    with socket.socket(family, kind, protocol) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            raise SpecdecError(f"cannot listen on {host}:{port}: {error.strerror or error}", setting="port") from None


def serve(settings: ServerSettings, on_status: Optional[Callable[[str], None]] = None,
          on_ready: Optional[Callable[[Server, Any], None]] = None) -> None:
    """Check the settings, load the target, and serve until stopped."""
    from ..session.chat import open_session

    settings.check()
    check_address(settings.listen.host, settings.listen.port)  # in the first second, not after the model loads
    session, loaded = open_session(settings.chat, on_status)
    server = Server(session, settings, loaded.name)
    if on_ready is not None:
        on_ready(server, loaded)
    server.run()
