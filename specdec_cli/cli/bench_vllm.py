"""`specdec bench --engine vllm`: the same prompts through vLLM, plain and speculative, rendered as a table.

Thin layer: flags -> VllmBenchSettings (checked before anything loads) -> the tokenizer and the model directory
(no weights in this process) -> bench.vllm_bench.run_vllm_bench with a progress bar -> files and a table (or
--json). The library call and its rows are documented in specdec_cli/bench/vllm_bench.py.
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence

from ..defaults import VLLM_DRAFT_MAX
from .common import cell, console, doing, err_console, table_width


def bench_vllm(*, target: str, suite: Optional[str], prompts: Optional[str], categories: Optional[str],
               limit: Optional[int], drafters: str, reference: Optional[str], index: Optional[str],
               memory: Optional[str], draft_max: Optional[int], max_new_tokens: int, dtype: str, raw: bool,
               warmup: bool, concurrency: int, json_out: Optional[str], csv_out: Optional[str], as_json: bool,
               unsupported: Sequence[str]) -> None:
    from ..bench import split_names, to_json_text, write_csv, write_json
    from ..bench.vllm_bench import RESULT_COLUMNS, VllmBenchSettings, VllmProgress, run_vllm_bench, vllm_methods
    from ..errors import SpecdecError
    from ..files import check_output_file
    from ..session.chat import format_prompt
    from ..target_model.models import load_target_text, resolve_target
    from ..texts.prompts import load_prompts
    from ..vllm.runner import INSTALL_HINT, vllm_installed

    if unsupported:
        raise SpecdecError(f"{', '.join(unsupported)}: not with --engine vllm (greedy, one run per method, on vLLM's "
                           "own kernels and threads)")
    settings = VllmBenchSettings(vllm_methods(split_names(drafters), split_names(reference)),
                                 draft_max=VLLM_DRAFT_MAX if draft_max is None else draft_max,
                                 max_new_tokens=max_new_tokens, concurrency=concurrency, dtype=dtype, index=index,
                                 memory=memory, warmup=warmup)
    settings.check()
    if not vllm_installed():
        raise SpecdecError(INSTALL_HINT)
    wanted = [name.strip() for name in (categories or "").split(",") if name.strip()]
    conversations = load_prompts(prompts, suite, categories=wanted, limit=limit)
    json_path = check_output_file(json_out, "json_out") if json_out else None
    csv_path = check_output_file(csv_out, "csv") if csv_out else None
    status = err_console().status("Loading the tokenizer…")
    with status:
        text = load_target_text(target, on_status=lambda message: status.update(message))
    prompt_ids = [format_prompt(text.tokenizer, [{"role": "user", "content": conversation.first_turn}], raw)
                  for conversation in conversations]

    from rich import progress as bars

    stderr = err_console()
    progress = bars.Progress(bars.TextColumn("{task.description}"), bars.BarColumn(), bars.MofNCompleteColumn(),
                             bars.TimeElapsedColumn(), console=stderr, transient=True, disable=not stderr.is_terminal)
    with progress, doing("benchmarking in vLLM", "no report was written"):
        task = progress.add_task("starting vLLM", total=None)

        def on_progress(update: VllmProgress) -> None:
            progress.update(task, total=update.total, completed=update.done, description=f"vLLM · {update.method:>8}")

        document = run_vllm_bench(text.location, resolve_target(target).name, prompt_ids, conversations,
                                  text.eos_token_ids, settings,
                                  suite=prompts or str(suite), on_progress=on_progress)
    if json_path:
        write_json(document, json_path)
    if csv_path:
        write_csv(document["results"], csv_path, RESULT_COLUMNS)
    if as_json:
        print(to_json_text(document), end="")
    else:
        render_vllm(document)
    for path in (json_path, csv_path):
        if path:
            err_console().print(f"[dim]wrote {path}[/dim]")


def render_vllm(document: dict) -> None:
    from rich.table import Table

    out = console()
    env, settings = document["environment"], document["settings"]
    lines = [
        f"Machine: {env['cpu']} · {env['cpu_cores']} cores · GPU: {env['gpu'] or 'none'}",
        f"Software: vLLM {env['vllm']} · specdec {env['specdec']} · Python {env['python']}",
        f"Model: {env['model']} · {env['dtype']} · {env['device']} · greedy · max {settings['max_new_tokens']} new "
        f"tokens · draft length {settings['draft_max']} · concurrent: {settings['concurrency']} in flight",
        f"Prompts: {settings['prompts']} · {len(settings['categories'])} categories · {settings['conversations']} "
        f"prompts (first turns) · {env['date']}",
    ]
    for line in lines:
        out.print(f"[dim]{line}[/dim]", soft_wrap=not out.is_terminal)
    table = Table(pad_edge=False)
    columns: list[tuple[str, Literal["left", "right"]]] = [
        ("Regime", "left"), ("Category", "left"), ("Method", "left"), ("Prompts", "right"), ("Tokens", "right"),
        ("Seconds", "right"), ("Tok/s", "right"), ("Speedup", "right"), ("τ", "right"), ("Accept", "right"),
        ("Identical", "right")]
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    previous = None
    for row in document["results"]:
        group = (row["regime"], row["category"])
        if previous is not None and group != previous:
            table.add_section()
        label = group if group != previous else ("", "")
        previous = group
        identical = f"{row['identical']}/{row['compared']}"
        if row["identical"] < row["compared"]:
            identical = f"[yellow]{identical}[/yellow]"
        table.add_row(*label, row["method"], str(row["prompts"]), str(row["new_tokens"]), cell(row["seconds"], ".1f"),
                      cell(row["tokens_per_second"], ".1f"), cell(row["speedup"], ".2f", "x"),
                      cell(row["mean_accepted_tokens"], ".2f"), cell(row["acceptance_rate"], ".0%"), identical,
                      style="bold" if row["category"] == "overall" else None)
    if not out.is_terminal:
        out.width = max(out.width, table_width(out, table))
    out.print(table)
    baseline = document["baseline_single_vs_concurrent"]
    notes = [
        "speedup = tokens/s ÷ none's (vLLM plain) in the same regime · τ = tokens per target forward · "
        "Identical = outputs token-equal to none's in the same regime (greedy)",
        f"none: single and concurrent outputs identical {baseline['identical']}/{baseline['compared']} "
        "(vLLM's own batch-shape rounding)",
    ]
    for line in notes:
        out.print(f"[dim]{line}[/dim]", soft_wrap=not out.is_terminal)
    for name, reason in (settings.get("references_skipped") or {}).items():
        out.print(f"[yellow]{name}: skipped: {reason}[/yellow]", soft_wrap=not out.is_terminal)
