"""`specdec bench --engine vllm`: the same prompts through vLLM, plain and speculative, rendered as a table.

Thin layer: bench's run settings and rows -> VllmBenchSettings (checked before anything loads) -> the tokenizer
and the model directory (no weights in this process) -> bench.vllm_bench.run_vllm_bench with a progress bar ->
files and a table (or --json). The library call and its rows are documented in specdec_cli/bench/vllm_bench.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Literal, Sequence

from ..bench.report import ReportFiles
from ..bench.settings import PromptChoice, bench_settings
from ..bench.vllm_bench import RESULT_COLUMNS, VllmBenchSettings, VllmProgress, run_vllm_bench, vllm_methods
from ..errors import SpecdecError
from ..target_model.load import models, target_source
from ..texts.prompt_ids import first_turn_ids
from ..vllm import runner as vllm_runner
from .common import cell, console, doing, err_console, show_report, table_width


def bench_vllm(values: dict, drafters: Sequence[str], references: Sequence[str], chosen: PromptChoice,
               files: ReportFiles, as_json: bool, *, concurrency: int, unsupported: Sequence[str]) -> None:
    """`values`: bench's flags named as its settings' fields; `chosen`: the prompts; `files`: the report's files
    (--json-out, --csv); `as_json`: the report instead of the table."""
    if unsupported:
        raise SpecdecError(f"{', '.join(unsupported)}: not with --engine vllm (greedy, one run per method, on vLLM's "
                           "own kernels and threads)")
    settings = VllmBenchSettings(bench_settings(vllm_methods(drafters, references), **values), concurrency=concurrency)
    settings.check()
    run = settings.bench.run
    if not vllm_runner.vllm_installed():
        raise SpecdecError(vllm_runner.INSTALL_HINT)
    conversations = chosen.load()
    paths = files.check()
    target = run.load.target
    status = err_console().status("Loading the tokenizer…")
    with status:
        text = models.load_target_text(target, on_status=lambda message: status.update(message))
    prompt_ids = [first_turn_ids(text.tokenizer, conversation.first_turn, run.raw) for conversation in conversations]
    with _vllm_progress() as on_progress, doing("benchmarking in vLLM", "no report was written"):
        document = run_vllm_bench(text.location, target_source.resolve_target(target).name, prompt_ids, conversations,
                                  text.eos_token_ids, settings,
                                  suite=chosen.prompts or str(chosen.suite), on_progress=on_progress)
    show_report(document, as_json, render_vllm, paths.write(document, RESULT_COLUMNS))


@contextmanager
def _vllm_progress() -> Iterator[Callable[[VllmProgress], None]]:
    """A progress bar on stderr (a terminal only) for run_vllm_bench's updates: the method running, rows done."""
    from rich import progress as bars  # (rich's live display: loaded when a bench runs, not for --help)

    stderr = err_console()
    progress = bars.Progress(bars.TextColumn("{task.description}"), bars.BarColumn(), bars.MofNCompleteColumn(),
                             bars.TimeElapsedColumn(), console=stderr, transient=True, disable=not stderr.is_terminal)
    with progress:
        task = progress.add_task("starting vLLM", total=None)

        def on_progress(update: VllmProgress) -> None:
            progress.update(task, total=update.total, completed=update.done, description=f"vLLM · {update.method:>8}")

        yield on_progress


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
