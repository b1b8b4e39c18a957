"""The llama-server reference rows: llama.cpp's own server binary decoding the same prompts as specdec.

- `llama-server` starts the `llama-server` binary (from PATH, or `--llama-server PATH`) on the target's GGUF with
  as many threads as specdec computes with, one slot, on a free port of 127.0.0.1, and waits until /health says
  ok. `llama-server:TYPE` (TYPE one of SPEC_TYPES) starts it with `--spec-type TYPE`, its n-gram speculative
  decoding with llama.cpp's defaults for that type.
- `--reference http://HOST:PORT` uses a llama.cpp server that is already running (its own threads and settings;
  the row is named `llama-server@HOST:PORT` and the report records what /props says it runs).

Prompts go to `/completion` as token ids: the very ids specdec's chat template and tokenizer made, so both engines
see the same prompt to the token (the server adds nothing to a prompt given as ids; its chat endpoint would apply
the GGUF's template through its own Jinja engine and tokenize again, which nothing guarantees to be identical).
Decoding is greedy (temperature 0, top_k 1, no penalties), `cache_prompt` off (every prompt is processed whole,
as specdec does), at most the same max new tokens, and the server returns its token ids (`return_tokens`), so
identity with specdec's plain output is checked token by token. Time comes from llama.cpp's own per-request
`timings`: a turn takes prompt_ms + predicted_ms, its time to first token is prompt_ms; n-gram rows also report
draft_n and draft_n_accepted.

A server started here is always stopped: after the run, on an error and on Ctrl-C (it runs in its own session,
so the terminal's Ctrl-C reaches specdec only, and on Linux it is told to exit should specdec die). Its log goes
to a temporary file, removed after a clean run and kept (its last lines shown) when the server fails.

The row names and the binary's whereabouts are llama_server_names.py's; the HTTP requests, llama_server_http.py's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import SpecdecError
from ..processes import stop_child
from .llama_server_http import error_text, probe, request, running_spec_types, spec_types
from .llama_server_names import LLAMA_SERVER, find_binary, spec_type_of

CONTEXT_TOKENS = 8192  # the server's context (at most the model's own); a longer prompt is refused with a reason
START_SECONDS = 180.0  # a server that is not healthy by then is reported, with its log
LOG_LINES = 15


class LlamaServerError(SpecdecError):
    """A llama.cpp server failed: the message is one line, `log_tail` the last lines of its log (if any)."""

    def __init__(self, message: str, log_tail: Sequence[str] = (), log_path: Optional[str] = None):
        super().__init__(message)
        self.log_tail = list(log_tail)
        self.log_path = log_path


# ------------------------------------------------------------------------------------------------ one server


@dataclass
class ServerTurn:
    """One request's result, timed by llama.cpp's own `timings`."""

    tokens: list[int]
    seconds: float  # prompt_ms + predicted_ms
    ttft: float  # prompt_ms
    finish: str  # "eos" | "length" | "stop"
    drafted: Optional[int] = None
    accepted: Optional[int] = None
    wall_seconds: float = 0.0  # around the HTTP request (JSON and HTTP included)


@dataclass
class LlamaServer:
    """One llama.cpp server: started here from `binary` on `gguf_path`, or one already running at `url`."""

    name: str
    binary: Optional[str] = None
    gguf_path: Optional[str] = None
    threads: int = 1
    spec_type: str = ""
    url: Optional[str] = None
    start_seconds: float = START_SECONDS
    process: Optional[subprocess.Popen] = field(default=None, repr=False)
    log_path: Optional[str] = None
    props: dict = field(default_factory=dict)
    port: Optional[int] = None
    spec_types: Optional[str] = None  # what the server says it decodes with ("none", "ngram-mod"), if it says
    tokens_from: str = "server token ids"  # or "text" (a server that returns no ids)
    prompt_tokens_reused: int = 0  # cache_n over all requests (0 with cache_prompt off)
    timed_seconds: float = 0.0  # llama.cpp's prompt_ms + predicted_ms over all requests
    request_seconds: float = 0.0  # the wall time around those requests (HTTP and JSON included)

    @property
    def started_here(self) -> bool:
        return self.binary is not None

    @property
    def n_ctx(self) -> Optional[int]:
        value = (self.props.get("default_generation_settings") or {}).get("n_ctx")
        return int(value) if isinstance(value, int) and value > 0 else None

    def command(self, port: int) -> list[str]:
        assert self.binary and self.gguf_path
        command = [self.binary, "-m", self.gguf_path, "--host", "127.0.0.1", "--port", str(port),
                   "-t", str(self.threads), "-tb", str(self.threads), "-np", "1",
                   "-c", str(context_tokens(self.gguf_path))]
        if self.spec_type:
            command += ["--spec-type", self.spec_type]
        return command

    # -- life cycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        if not self.started_here:
            assert self.url
            self.props = probe(self.url)
            self.spec_types = running_spec_types(self.url, self.props)
            return
        for attempt in range(3):  # a port taken between choosing it and the server binding it: another one
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._spawn(self.port)
            try:
                self._wait_healthy()
                return
            except LlamaServerError as error:
                lost_port = any("bind" in line.lower() for line in error.log_tail)
                if not lost_port or attempt == 2:
                    raise
                if error.log_path:
                    os.unlink(error.log_path)

    def _spawn(self, port: int) -> None:
        handle, self.log_path = tempfile.mkstemp(prefix="specdec-llama-server-", suffix=".log")
        with os.fdopen(handle, "wb") as log:
            self.process = subprocess.Popen(self.command(port), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=_exit_with_parent if sys.platform == "linux" else None)

    def _wait_healthy(self) -> None:
        assert self.process is not None and self.url
        deadline = time.monotonic() + self.start_seconds
        while True:
            code = self.process.poll()
            if code is not None:
                raise self._failure(f"{self.name}: {self.binary} exited during start-up (exit status {code})")
            try:
                status, _ = request(self.url + "/health", timeout=2.0)
            except OSError:
                status = 0
            if status == 200:
                break
            if time.monotonic() > deadline:
                raise self._failure(f"{self.name}: not healthy after {self.start_seconds:.0f} s")
            time.sleep(0.05)
        _, props = request(self.url + "/props", timeout=10.0)
        self.props = props if isinstance(props, dict) else {}

    def stop(self, keep_log: bool = False) -> None:
        """Stop a server started here (SIGTERM, then SIGKILL after 10 s); remove its log unless kept."""
        process, self.process = self.process, None
        if process is not None:
            stop_child(process, grace_seconds=10)
        if self.log_path and not keep_log:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
            self.log_path = None

    def log_tail(self, lines: int = LOG_LINES) -> list[str]:
        if not self.log_path:
            return []
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - 64 * 1024))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]

    def _failure(self, message: str) -> LlamaServerError:
        """The error for a failed server; it is stopped, and its log kept for the user."""
        tail = self.log_tail()
        path = self.log_path
        self.stop(keep_log=True)
        self.log_path = None  # the error names it; nothing here removes it
        where = f" (its log: {path})" if path else ""
        return LlamaServerError(message + where, tail, path)

    # -- one request --------------------------------------------------------------------------------------

    def generate(self, prompt_ids: Sequence[int], config: Any, tokenizer: Any = None) -> ServerTurn:
        """One prompt (token ids) decoded by the server, greedy or sampled as `config` says."""
        assert self.url, "start() first"
        n_ctx = self.n_ctx
        if n_ctx is not None and len(prompt_ids) + config.max_new_tokens > n_ctx:
            raise SpecdecError(f"{self.name}: its context ({n_ctx} tokens) is too short for a prompt of "
                               f"{len(prompt_ids)} tokens and {config.max_new_tokens} new ones")
        body: dict[str, Any] = {
            "prompt": [int(token) for token in prompt_ids], "n_predict": int(config.max_new_tokens),
            "stream": False, "cache_prompt": False, "return_tokens": True,
            "repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "dry_multiplier": 0.0,
            "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "xtc_probability": 0.0,
        }
        if config.greedy:
            body.update(temperature=0.0, top_k=1)
        else:
            body.update(temperature=float(config.temperature), top_k=0)
            if config.seed is not None:
                body["seed"] = int(config.seed)
        started = time.perf_counter()
        try:
            status, payload = request(self.url + "/completion", body)
        except OSError as error:
            raise self._lost(f"the request failed ({getattr(error, 'reason', error)})") from None
        wall = time.perf_counter() - started
        if status != 200 or not isinstance(payload, dict):
            raise self._lost(f"/completion answered {status} ({error_text(payload)})")
        return self._turn(payload, wall, config, tokenizer)

    def _lost(self, what: str) -> SpecdecError:
        if self.started_here and self.process is not None and self.process.poll() is not None:
            return self._failure(f"{self.name}: the server exited (status {self.process.poll()}); {what}")
        if self.started_here:
            return self._failure(f"{self.name}: {what}")
        return SpecdecError(f"{self.name}: {what}")

    def _turn(self, payload: dict, wall: float, config: Any, tokenizer: Any) -> ServerTurn:
        timings = payload.get("timings")
        needed = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
        if not isinstance(timings, dict) or any(not isinstance(timings.get(key), (int, float)) for key in needed):
            raise self._lost("its answer has no `timings` (prompt_n, prompt_ms, predicted_n, predicted_ms): "
                             "not a llama.cpp server?")
        eos = set(config.eos_token_ids)
        stop_type = str(payload.get("stop_type", ""))
        tokens = payload.get("tokens")
        if isinstance(tokens, list) and (tokens or not timings["predicted_n"]):
            tokens = [int(token) for token in tokens]
        else:  # a server that returns no token ids: its text, tokenized here (and its end of sequence)
            self.tokens_from = "text"
            text = str(payload.get("content", ""))
            tokens = list(tokenizer.encode(text, add_special_tokens=False)) if tokenizer is not None and text else []
            if stop_type == "eos" and config.eos_token_ids:
                tokens.append(int(config.eos_token_ids[0]))
        self.prompt_tokens_reused += int(timings.get("cache_n") or 0)
        self.spec_types = spec_types(payload.get("generation_settings")) or self.spec_types
        finish = "eos" if stop_type == "eos" or (tokens and tokens[-1] in eos) else (
            "length" if stop_type in ("limit", "") else "stop")
        prompt_s, predicted_s = timings["prompt_ms"] / 1000.0, timings["predicted_ms"] / 1000.0
        drafted = timings.get("draft_n")
        accepted = timings.get("draft_n_accepted")
        self.timed_seconds += prompt_s + predicted_s
        self.request_seconds += wall
        return ServerTurn(tokens, prompt_s + predicted_s, prompt_s, finish,
                          int(drafted) if drafted is not None else (0 if self.spec_type else None),
                          int(accepted) if accepted is not None else (0 if self.spec_type else None), wall)

    def report(self) -> dict:
        """What the bench's JSON records about this server."""
        return {
            "started_here": self.started_here,
            "url": self.url,
            "binary": self.binary,
            "threads": self.threads if self.started_here else None,
            "spec_type": self.spec_type or ("none" if self.started_here else None),
            "speculative_types": self.spec_types,
            "model_path": self.props.get("model_path"),
            "n_ctx": self.n_ctx,
            "build_info": self.props.get("build_info"),
            "tokens_from": self.tokens_from,
            "prompt_tokens_reused": self.prompt_tokens_reused,
            "timing": "llama.cpp's timings: prompt_ms + predicted_ms per request",
            "timed_seconds": round(self.timed_seconds, 6),  # warm-up included
            "request_seconds": round(self.request_seconds, 6),
        }


def _exit_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the server gets SIGTERM should specdec die without stopping it (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
    except Exception:
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


def context_tokens(gguf_path: str) -> int:
    """The server's context: CONTEXT_TOKENS, or the model's own context length where it is shorter (read by
    target_model's one GGUF reader)."""
    from ..target_model.gguf.gguf_file import open_gguf

    try:
        gguf = open_gguf(Path(gguf_path))
        length = gguf.metadata.get(f"{gguf.architecture}.context_length")
        return CONTEXT_TOKENS if length is None else max(256, min(CONTEXT_TOKENS, int(length)))
    except Exception:
        return CONTEXT_TOKENS


# ------------------------------------------------------------------------------------------------ the rows


@dataclass
class ServerRows:
    """The llama-server rows of one run: which can run (a server each) and which are skipped, and why."""

    servers: dict[str, LlamaServer] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        for server in self.servers.values():
            server.start()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def plain_row(self) -> Optional[str]:
        """The row that is llama.cpp's server decoding plainly (what `speedup_vs_llama_server` compares with):
        `llama-server`, else the first server named by URL that runs no speculative decoding."""
        for name, server in self.servers.items():
            if server.started_here and not server.spec_type:
                return name
        for name, server in self.servers.items():
            if not server.started_here and server.spec_types == "none":
                return name
        return None

    def report(self) -> dict:
        return {name: server.report() for name, server in self.servers.items()}


def plan(methods: Sequence[Any], binary: Optional[str], gguf_path: Optional[str], threads: int = 1,
         probe_urls: bool = True) -> ServerRows:
    """The servers for the `llama-server` methods among `methods` (none started yet). Skipped with a reason:
    every spawned row when there is no binary or the target is not a GGUF. Errors (one line): a --llama-server
    PATH that is not an executable file, a URL where no llama.cpp server answers (when `probe_urls`)."""
    rows = ServerRows()
    wanted = [method for method in methods if method.kind == LLAMA_SERVER]
    spawned = [method for method in wanted if not method.url]
    path: Optional[str] = None
    if spawned or binary:
        path, missing = find_binary(binary)
        reason = missing or (None if gguf_path else "the target is not a .gguf file (or pass --reference "
                                                     "http://HOST:PORT of a llama.cpp server running its GGUF)")
        if reason:
            rows.skipped.update({method.name: reason for method in spawned})
            spawned = []
    for method in wanted:
        if method.url:
            server = LlamaServer(method.name, url=method.url)
            if probe_urls:
                server.start()
            rows.servers[method.name] = server
        elif method in spawned:
            rows.servers[method.name] = LlamaServer(method.name, binary=path, gguf_path=gguf_path, threads=threads,
                                                    spec_type=spec_type_of(method.name))
    return rows
