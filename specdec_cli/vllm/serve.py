"""`specdec serve`: vLLM's OpenAI-compatible server on a target, with one of specdec's drafters as its proposer.

Settings: `ServeSettings` holds one vLLM engine's settings whole (runner.VllmSettings: the target's load, the
proposer, vLLM's sizes) and where it listens (listen.ListenSettings: address, API key), and keeps only the
server's own (extra arguments); `serve_settings`
builds them from values named as their fields, as the command line does.

What it does: checks the settings, resolves the target to a model directory vLLM can load (a GGUF is
converted once, as for every command), and runs `python -m vllm.entrypoints.openai.api_server` with the same
interpreter: `--speculative-config` names specdec's proposer class (proposer.py) and the environment variable
SPECDEC_VLLM_DRAFTER carries its settings (proposer_settings.py) into vLLM's engine process. Ctrl-C or SIGTERM is
passed on to the server, which shuts down; after a grace period it is killed.

Who may call it: with an API key (`--api-key`, or the VLLM_API_KEY environment variable, which keeps the key out
of `ps`) vLLM refuses requests without it; the key reaches vLLM through its environment, never its command line.
Listening beyond this machine (any non-loopback `--host`) without a key gets one warning line.

What it does not do: run vLLM in this process, or install it (`make install-vllm` does: vLLM's CPU build pins
its own transformers, so it gets its own virtual environment). `--drafter none` serves without speculation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..defaults import DEFAULT_DRAFTER, VLLM_DRAFTERS, VLLM_SERVE_PORT
from ..errors import SpecdecError
from ..listen import ListenSettings, is_loopback
from ..session.run_settings import run_settings, take_fields
from ..target_model.load import models, target_source
from ..target_model.load.load_settings import LoadSettings
from .proposer_settings import ProposerSettings
from .runner import CPU_MEMORY_FRACTION, INSTALL_HINT, NO_SPECULATION, VllmSettings, vllm_installed

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM's own: the server reads its key from here as from --api-key
GRACE_SECONDS = 30  # how long a stopping server may take before it is killed


@dataclass(frozen=True)
class ServeSettings:
    # the target and its dtype, the proposer (drafter none: no speculation), vLLM's context length and memory share
    engine: VllmSettings = field(default_factory=lambda: VllmSettings(LoadSettings(), ProposerSettings()))
    # the address and the key (api_key None: VLLM_API_KEY's, if set; else anyone may call)
    listen: ListenSettings = field(default_factory=lambda: ListenSettings(port=VLLM_SERVE_PORT))
    extra_args: tuple[str, ...] = ()  # passed to vLLM's server as they are

    @property
    def host(self) -> str:
        return self.listen.host

    @property
    def port(self) -> int:
        return self.listen.port

    @property
    def api_key(self) -> Optional[str]:
        return self.listen.api_key

    def key_in_force(self) -> Optional[str]:
        """The key the server will demand: --api-key, else VLLM_API_KEY from the environment, else none."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None

    def warnings(self) -> list[str]:
        """One line when the server listens beyond this machine without an API key."""
        if is_loopback(self.host) or self.key_in_force():
            return []
        return [f"--host {self.host} listens beyond this machine and no API key is set: anyone who can reach port "
                f"{self.port} can use the model; set one with --api-key or the {API_KEY_ENV} environment variable"]

    def check(self) -> None:
        drafter = self.engine.method
        if drafter != NO_SPECULATION and drafter not in VLLM_DRAFTERS:
            raise SpecdecError(f"drafter {drafter}: `specdec serve` drafts with none, {', '.join(VLLM_DRAFTERS)} "
                               "(vLLM verifies chains)", setting="drafter")
        self.engine.check()  # the draft length, the shortest match, vLLM's sizes
        self.engine.proposer.check_index()
        if self.engine.proposer.drafter.options.index:
            from ..sam.index import read_index_info

            read_index_info(self.engine.proposer.drafter.options.index)
        self.listen.check()
        if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in self.extra_args):
            raise SpecdecError("give the API key as specdec's --api-key (or VLLM_API_KEY), before vLLM's own options",
                               setting="api_key")


def serve_settings(drafter: str = DEFAULT_DRAFTER, **values: Any) -> ServeSettings:
    """ServeSettings from values named as the fields of ServeSettings (host, port, ...), VllmSettings (max_model_len,
    memory_fraction), ProposerSettings (min_match) and the run's (session/run_settings.run_settings: target, dtype,
    index, draft_max: vLLM's num_speculative_tokens); the rest keep their defaults. `specdec serve` builds its
    settings here from its flags."""
    own, engine, proposer = (take_fields(kind, values) for kind in (ServeSettings, VllmSettings, ProposerSettings))
    listen = ListenSettings(**{"port": VLLM_SERVE_PORT, **take_fields(ListenSettings, values)})
    run = run_settings(drafter, **values)
    proposer_settings = ProposerSettings(run.drafter, num_speculative_tokens=run.generation.draft_max, **proposer)
    return ServeSettings(VllmSettings(run.load, proposer_settings, **engine), listen, **own)


def server_command(settings: ServeSettings, model_dir: str, served_name: str,
                   cpu_build: bool) -> tuple[list[str], dict[str, str]]:
    """The server's argv and the environment entries it needs (the proposer's settings)."""
    engine = settings.engine
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", model_dir, "--served-model-name", served_name,
            "--dtype", engine.load.dtype, "--host", settings.host, "--port", str(settings.port)]
    fraction = engine.memory_fraction if engine.memory_fraction is not None else (
        CPU_MEMORY_FRACTION if cpu_build else None)
    if fraction is not None:
        argv += ["--gpu-memory-utilization", str(fraction)]
    if engine.max_model_len is not None:
        argv += ["--max-model-len", str(engine.max_model_len)]
    speculative, env = engine.speculative()  # (none: no speculative config)
    if speculative is not None:
        argv += ["--speculative-config", json.dumps(speculative)]
    if settings.api_key:  # through the environment: an argument would show the key in `ps` to every local user
        env[API_KEY_ENV] = settings.api_key
    return argv + list(settings.extra_args), env


def serve(settings: ServeSettings, on_status: Optional[Callable[[str], None]] = None,
          run: Callable[[Sequence[str], dict[str, str]], int] | None = None,
          on_warning: Optional[Callable[[str], None]] = None) -> int:
    """Check, resolve the target, run the server until it stops; its exit status (130/143 after Ctrl-C/SIGTERM).
    `on_warning` is told `settings.warnings()` once the settings are good, before the server starts."""
    settings.check()
    if run is None and not vllm_installed():
        raise SpecdecError(INSTALL_HINT)
    for warning in settings.warnings():
        (on_warning or (lambda line: None))(warning)
    source = target_source.resolve_target(settings.engine.load.target)
    model_dir = models.model_location(source, on_status)
    argv, env = server_command(settings, model_dir, source.name, cpu_build=_cpu_build())
    return (run or _run_server)(argv, env)


def _cpu_build() -> bool:
    import torch

    return not torch.cuda.is_available()


def _run_server(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run the server in the foreground; pass Ctrl-C and SIGTERM on to it and wait for it to stop."""
    child = subprocess.Popen(list(argv), env={**os.environ, **env})
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            code = child.wait()
        except subprocess.TimeoutExpired:  # pragma: no cover - wait() without a timeout does not raise it
            code = 1
        if received:
            return 130 if received[0] == signal.SIGINT else 143
        return code
    finally:
        if child.poll() is None:
            try:
                child.wait(timeout=GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
