"""`specdec serve`: an OpenAI-compatible server. By default on specdec's own engine (specdec_cli/server/: the chat
session's engine, any drafter, exact verification, the prompt cache); `--engine vllm` runs vLLM's server with a
specdec proposer (specdec_cli/vllm/serve.py), where unknown options after the known ones go to vLLM as they are
(e.g. `--max-num-seqs 16`).
"""

from __future__ import annotations

from typing import Optional

import typer

from ..defaults import (
    DEFAULT_DRAFTER,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_SERVE_MAX_CONNECTIONS,
    DEFAULT_SERVE_PARALLEL,
    DEFAULT_SERVE_PORT,
    DEFAULT_SERVE_QUEUE,
    DEFAULT_SERVE_TIMEOUT,
    MAX_SERVE_QUEUE,
    VLLM_DRAFT_MAX,
    VLLM_DRAFTERS,
    VLLM_MIN_MATCH,
    VLLM_SERVE_PORT,
)
from ..drafters import DRAFTERS, HYBRID_HEAD
from ..errors import SpecdecError
from ..vllm.serve import serve, serve_settings
from . import app, options
from .common import apply_kv_cache, apply_threads, cache_kept_since, doing, err_console, say_loaded


@app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve_command(
    ctx: typer.Context,
    engine: str = options.choice("specdec", "--engine", options.ENGINES, help="specdec: specdec's own engine (any drafter, exact verification, the prompt cache); vllm: vLLM's server with a specdec proposer (needs `make install-vllm`)."),
    target: str = options.target(),
    drafter: str = typer.Option(DEFAULT_DRAFTER, "--drafter", "-d", help=f"{', '.join(DRAFTERS)}, or {HYBRID_HEAD}+AUX; with --engine vllm: none (no speculation), {', '.join(VLLM_DRAFTERS)} (vLLM verifies chains)."),
    index: Optional[str] = options.index(),
    aux: str = options.aux(),
    draft_model: Optional[str] = options.draft_model(),
    draft_min_prob: float = options.draft_min_prob(),
    draft_max: Optional[int] = typer.Option(None, "--draft-max", help=f"Longest draft per step (default: 8; {VLLM_DRAFT_MAX} with --engine vllm, its num_speculative_tokens)."),
    max_new_tokens: int = options.max_new_tokens(DEFAULT_MAX_NEW_TOKENS),
    temperature: float = options.temperature(note=" for requests that name none"),
    top_p: float = options.top_p(),
    top_k: int = options.top_k(),
    seed: Optional[int] = options.seed(note=" for sampling"),
    system: Optional[str] = typer.Option(None, "--system", "-s", help="System message for chat requests that send none."),
    raw: bool = options.raw(),
    threads: Optional[int] = options.threads(),
    device: str = options.device(),
    dtype: str = options.dtype(),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
    memory: Optional[bool] = typer.Option(None, "--memory/--no-memory", show_default=False, help="Keep every answer on disk and let sam draft from them for every later request, whoever sends it (default: on only for a server on this machine without a key; SPECDEC_NO_MEMORY=1 turns it off)."),
    exact: Optional[bool] = options.exact(),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: Optional[int] = typer.Option(None, "--port", help=f"Port to listen on (default {DEFAULT_SERVE_PORT}; {VLLM_SERVE_PORT} with --engine vllm)."),
    queue: int = typer.Option(DEFAULT_SERVE_QUEUE, "--queue", help=f"Requests that may wait behind the one being answered (at most {MAX_SERVE_QUEUE}); more are refused with 429."),
    parallel: str = typer.Option(DEFAULT_SERVE_PARALLEL, "--parallel", "-np", help="Requests answered together, their steps sharing each forward (1-8); each answer stays exactly what it would be alone. auto: 4 where one forward scores several answers (block weights), else 1. llama-server's name."),
    max_connections: int = typer.Option(DEFAULT_SERVE_MAX_CONNECTIONS, "--max-connections", help="Connections held at once; more are answered 503 and closed."),
    timeout: float = typer.Option(DEFAULT_SERVE_TIMEOUT, "--timeout", help="Seconds a request's headers may take to arrive, and then as long for its body (slow clients are closed, 408)."),
    cors_origins: Optional[str] = typer.Option(None, "--cors-origins", help="Web origins whose pages may call the server, comma-separated (e.g. http://localhost:3000), or * for any (only on 127.0.0.1 or with a key). Default: none."),
    alias: Optional[str] = typer.Option(None, "--alias", help="The model name /v1/models lists (any name is served)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Refuse requests without this key (`Authorization: Bearer KEY`). SPECDEC_API_KEY (VLLM_API_KEY with --engine vllm) does the same and keeps the key out of `ps`."),
    min_match: int = typer.Option(VLLM_MIN_MATCH, "--min-match", help="--engine vllm: draft only continuations of matches this long (vLLM verifies every drafted token)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="--engine vllm: longest context (default: the model's)."),
    memory_fraction: Optional[float] = typer.Option(None, "--gpu-memory-utilization", help="--engine vllm: vLLM's memory share for weights and KV cache (default: vLLM's; 0.3 on its CPU build)."),
) -> None:
    """Serve the target with an OpenAI-compatible API (chat and text completions, streaming), on specdec's engine."""
    _refuse_the_other_engines_flags(ctx, engine)
    if engine == "vllm":
        _serve_vllm(ctx, target, drafter, index, draft_max, min_match, dtype, host, port, max_model_len,
                    memory_fraction, api_key)
        return
    if ctx.args:
        raise SpecdecError(f"unknown option(s) for --engine specdec: {' '.join(ctx.args)} (options after the known "
                           "ones go to vLLM only with --engine vllm)")
    from ..server.settings import server_settings

    settings = server_settings(
        host=host, port=port, queue=queue, parallel=parallel, api_key=api_key, model_name=alias,
        max_connections=max_connections,
        timeout=timeout, cors_origins=tuple(part.strip() for part in (cors_origins or "").split(",") if part.strip()),
        system=system, remember=memory, drafter=drafter, target=target, device=device, dtype=dtype,
        weights=weights, index=index, aux=aux, draft_model=draft_model, draft_min_prob=draft_min_prob,
        draft_max=draft_max, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        seed=seed, raw=raw, exact=exact)
    if threads is not None:
        apply_threads(threads)
    apply_kv_cache(kv_cache)
    _serve_specdec(settings)


VLLM_ONLY = ("min_match", "max_model_len", "memory_fraction")
SPECDEC_ONLY = ("aux", "draft_model", "draft_min_prob", "max_new_tokens", "temperature", "top_p", "top_k", "seed",
                "system", "raw", "threads", "device", "weights", "kv_cache", "memory", "exact", "queue", "alias", "max_connections",
                "timeout", "cors_origins", "parallel")


def _refuse_the_other_engines_flags(ctx: typer.Context, engine: str) -> None:
    """A flag given on the command line that the chosen engine does not use is an error, not ignored."""
    others = SPECDEC_ONLY if engine == "vllm" else VLLM_ONLY
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    given = [flags[name] for name in others
             if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")]
    if given:
        other = "specdec" if engine == "vllm" else "vllm"
        raise SpecdecError(f"{', '.join(given)}: only --engine {other} uses {'it' if len(given) == 1 else 'them'}")


def _serve_specdec(settings) -> None:
    import logging

    from rich.markup import escape

    from ..server.run import serve
    from ..server.settings import API_KEY_ENV

    logging.basicConfig(format="specdec: %(message)s", level=logging.INFO)
    if settings.open_to_others:
        err_console().print(f"[yellow]warning:[/yellow] {escape(settings.listen.host)} without --api-key (or {API_KEY_ENV}): "
                            "anyone who reaches the port can use the model", soft_wrap=True)
    status = err_console().status("Loading model…")
    status.start()

    def ready(server, loaded) -> None:
        status.stop()
        say_loaded(loaded)
        session = server.worker.session
        slots = server.worker.parallel
        err_console().print(f"serving {escape(server.model_name)} with {escape(session.drafter_name)} drafting "
                            f"(exact verification: {escape(session.engine.forward.outcome.text())}), "
                            f"{slots} request{'s' if slots > 1 else ''} at a time, at {server.url}/v1 · chat page: "
                            f"{server.url}/ · Ctrl-C stops", highlight=False, soft_wrap=True)

    try:
        with doing("serving", cache_kept_since()):
            stopped_by = serve(settings, on_status=lambda message: status.update(message), on_ready=ready)
    finally:
        status.stop()
    err_console().print(f"server stopped{f' ({stopped_by})' if stopped_by else ''}", highlight=False)


def _serve_vllm(ctx, target, drafter, index, draft_max, min_match, dtype, host, port, max_model_len, memory_fraction,
                api_key) -> None:
    from rich.markup import escape

    settings = serve_settings(drafter.strip().lower(), target=target, index=index,
                              draft_max=VLLM_DRAFT_MAX if draft_max is None else draft_max, min_match=min_match,
                              dtype=dtype, host=host, port=VLLM_SERVE_PORT if port is None else port,
                              max_model_len=max_model_len, memory_fraction=memory_fraction,
                              extra_args=tuple(ctx.args), api_key=api_key)
    code = serve(settings, on_status=lambda message: err_console().print(f"[dim]{message}[/dim]"),
                 on_warning=lambda message: err_console().print(f"[yellow]warning:[/yellow] {escape(message)}",
                                                                soft_wrap=True))  # one line, however wide
    if code in (130, 143):
        err_console().print("server stopped")
    raise typer.Exit(code)


