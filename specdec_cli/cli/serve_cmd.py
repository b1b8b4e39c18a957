"""`specdec serve`: vLLM's OpenAI-compatible server with a specdec proposer (thin layer over specdec_cli/vllm/serve.py).

Unknown options after the known ones go to vLLM's server as they are (e.g. `--max-num-seqs 16`).
"""

from __future__ import annotations

from typing import Optional

import typer

from ..defaults import DEFAULT_DRAFTER, VLLM_DRAFT_MAX, VLLM_DRAFTERS, VLLM_MIN_MATCH
from ..target_model.load_settings import DTYPES
from . import app, options
from .common import err_console


@app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve_command(
    ctx: typer.Context,
    target: str = options.target(),
    drafter: str = typer.Option(DEFAULT_DRAFTER, "--drafter", "-d", help=f"none (no speculation), {', '.join(VLLM_DRAFTERS)}: "
                                "the drafters vLLM can run (it verifies chains)."),
    index: Optional[str] = options.index(),
    draft_max: int = typer.Option(VLLM_DRAFT_MAX, "--draft-max", help="vLLM's num_speculative_tokens: longest draft per step."),
    min_match: int = typer.Option(VLLM_MIN_MATCH, "--min-match", help="Draft only continuations of matches this long "
                                  "(vLLM verifies every drafted token)."),
    dtype: str = options.choice("auto", "--dtype", DTYPES, help="vLLM's dtype: auto, float32, bfloat16, float16."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Longest context (default: the "
                                                "model's)."),
    memory_fraction: Optional[float] = typer.Option(None, "--gpu-memory-utilization", help="vLLM's memory share for "
                                                    "weights and KV cache (default: vLLM's; 0.3 on its CPU build)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Refuse requests without this key (`Authorization: "
                                          "Bearer KEY`). The VLLM_API_KEY environment variable does the same and keeps "
                                          "the key out of `ps`."),
) -> None:
    """Serve the target with vLLM's OpenAI-compatible API, drafting with specdec (needs `make install-vllm`)."""
    from rich.markup import escape

    from ..vllm.serve import serve, serve_settings

    settings = serve_settings(drafter.strip().lower(), target=target, index=index, draft_max=draft_max,
                              min_match=min_match, dtype=dtype, host=host, port=port, max_model_len=max_model_len,
                              memory_fraction=memory_fraction, extra_args=tuple(ctx.args), api_key=api_key)
    code = serve(settings, on_status=lambda message: err_console().print(f"[dim]{message}[/dim]"),
                 on_warning=lambda message: err_console().print(f"[yellow]warning:[/yellow] {escape(message)}",
                                                                soft_wrap=True))  # one line, however wide
    if code in (130, 143):
        err_console().print("server stopped")
    raise typer.Exit(code)
