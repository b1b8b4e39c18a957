"""`specdec bench`: plain decoding, the chosen drafters and reference rows on the same prompts, one process.

Thin layer: flags -> prompts and BenchSettings (checked before the slow model load) -> bench.run_bench with
a Rich progress bar on stderr -> files (--json-out, --csv, --plot) and a Rich table (or --json) on stdout.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..bench import parse_lengths, resolve_methods, run_bench, split_names
from ..bench.llama_server import LlamaServerError
from ..bench.report import ReportFiles, report_document
from ..bench.runner import check_bench
from ..bench.settings import BenchSettings, PromptChoice, bench_settings
from ..defaults import DEFAULT_BENCH_MAX_NEW_TOKENS, VLLM_DRAFTERS
from ..errors import SpecdecError
from ..heap import settle_heap
from ..vllm.runner import VLLM_METHODS
from . import app, options
from .bench_vllm import bench_vllm
from .common import (
    apply_kv_cache,
    apply_threads,
    cell,
    console,
    doing,
    err_console,
    load_target,
    show_report,
    table_width,
)

DEFAULT_DRAFTERS = "none,pld,sam"
DEFAULT_SUITE = "builtin"


@app.command("bench")
def bench(
    suite: Optional[str] = options.suite(note=f" (default: {DEFAULT_SUITE})"),
    prompts: Optional[str] = options.prompts(),
    categories: Optional[str] = typer.Option(None, "--categories", help="Keep only these categories, comma-separated (e.g. mt_bench,qa)."),
    limit: Optional[int] = options.limit(),
    drafters: str = options.drafters(DEFAULT_DRAFTERS),
    reference: Optional[str] = typer.Option(None, "--reference", help="Reference rows, comma-separated: hf (transformers' greedy generate), hf-pld (its prompt lookup, 10 tokens), llama.cpp (llama.cpp's plain decoding of the same GGUF through its Python binding; needs llama-cpp-python), llama.cpp-pld (the binding's prompt lookup), llama-server (llama.cpp's own server binary on the same GGUF; `make install-llama-server`), llama-server:ngram-mod, llama-server:ngram-simple, llama-server:ngram-map-k (its n-gram speculative decoding), or http://HOST:PORT (a llama.cpp server, or a `specdec serve`, already running)."),
    llama_server: Optional[str] = typer.Option(None, "--llama-server", help="The llama-server binary for the llama-server rows (default: llama-server on PATH)."),
    oracle: bool = typer.Option(False, "--oracle", help="Add oracle rows that replay the baseline's own output: the ceiling speedup per draft length."),
    oracle_lengths: str = typer.Option("2,4,8,16", "--oracle-lengths", help="Draft lengths of the --oracle rows, comma-separated."),
    target: str = options.target(),
    index: Optional[str] = options.index(),
    aux: str = options.aux(),
    l_threshold: int = typer.Option(1, "--l-threshold", help="sam: the auxiliary drafts when the longest match is shorter than this."),
    draft_model: Optional[str] = options.draft_model(),
    draft_min_prob: float = options.draft_min_prob(),
    draft_max: Optional[int] = options.draft_max(),
    max_new_tokens: int = options.max_new_tokens(DEFAULT_BENCH_MAX_NEW_TOKENS),
    temperature: float = options.temperature(note=" (greedy runs check that every output is identical to plain decoding's)"),
    seed: Optional[int] = options.seed(note=" for sampling (per prompt: seed + 1000 x prompt + turn)"),
    batch: int = typer.Option(1, "--batch", help="Also answer every prompt's first turn N at a time (at most 8) on the engine's batched step, each drafter row again: total tokens/s beside the one-at-a-time rows, and whether every answer equals its answer alone."),
    repeats: int = typer.Option(1, "--repeats", help="Run each method N times per prompt; tokens/s is reported as mean ± std over repeats."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="One short untimed generation per method first."),
    raw: bool = options.raw(),
    json_out: Optional[str] = typer.Option(None, "--json-out", help="Write the full report (environment, settings, results, per_prompt) as JSON."),
    csv_out: Optional[str] = typer.Option(None, "--csv", help="Write the results rows as CSV."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write PNG charts into this directory (needs matplotlib)."),
    force: bool = typer.Option(False, "--force", help="Replace --json-out, --csv and --plot files that specdec did not write (FIFOs and devices never)."),
    as_json: bool = options.as_json("the report (instead of the table)"),
    threads: Optional[int] = options.threads(),
    device: str = options.device(),
    decoder: str = options.decoder(),
    dtype: str = options.dtype(),
    weights: str = options.weights(),
    kv_cache: Optional[str] = options.kv_cache(),
    memory: Optional[str] = typer.Option(None, "--memory", help="Let sam draft from this answer-memory directory (`specdec memory info` shows it); the bench never reads or writes the memory otherwise."),
    exact: Optional[bool] = options.exact(note="; when on, the `native` row times plain decoding on the model's own kernels"),
    engine: str = options.choice("specdec", "--engine", options.ENGINES, help="specdec (this process), or vllm: the methods inside vLLM "
                               f"(each in its own vLLM process; drafters {', '.join(VLLM_DRAFTERS)}; --reference "
                               f"{','.join(VLLM_METHODS)} for vLLM's own, default ngram; eagle3 drafts with --draft-model's EAGLE-3 head), one request at a time and "
                               "--concurrency at once. Needs `make install-vllm`."),
    concurrency: int = typer.Option(8, "--concurrency", help="--engine vllm: requests in flight in the concurrent "
                                    "rows (a new one as one finishes)."),
) -> None:
    """Measure speedup over plain decoding on a prompt suite (Spec-Bench conventions: greedy, batch 1, warm-up excluded)."""
    options.check_engine(engine)
    chosen = PromptChoice(suite if suite or prompts else DEFAULT_SUITE, prompts, categories, limit)
    files = ReportFiles(json_out, csv_out, plot, force)
    values = dict(target=target, device=device, decoder=decoder, dtype=dtype, weights=weights, index=index, aux=aux,
                  l_threshold=l_threshold, draft_model=draft_model, draft_min_prob=draft_min_prob, memory=memory,
                  draft_max=draft_max, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                  exact=exact, raw=raw, warmup=warmup)  # named as the settings' fields (bench/settings.py)
    if engine == "vllm":
        not_here = {"--oracle": oracle, "--temperature": temperature > 0, "--repeats": repeats > 1, "--batch": batch > 1,
                    "--draft-model": draft_model and "eagle3" not in split_names(reference), "--plot": plot, "--exact/--no-exact": exact is not None,
                    "--weights": weights != "auto", "--threads": threads is not None, "--device": device != "auto",
                    "--decoder": decoder != "auto", "--kv-cache": kv_cache is not None}
        bench_vllm(values, split_names(drafters), split_names(reference), chosen, files, as_json,
                   concurrency=concurrency, unsupported=[flag for flag, used in not_here.items() if used])
        return
    # Everything a user can get wrong is checked before the model loads.
    lengths = parse_lengths(oracle_lengths) if oracle else []
    if not split_names(drafters):
        raise SpecdecError("--drafters: give at least one name (none: plain decoding alone)", setting="drafters")
    settings = bench_settings(resolve_methods(split_names(drafters), split_names(reference), lengths),
                              repeats=repeats, llama_server=llama_server, batch=batch, **values)
    apply_kv_cache(kv_cache)
    bench_specdec(settings, chosen, files, as_json, threads)


def bench_specdec(settings: BenchSettings, chosen: PromptChoice, files: ReportFiles, as_json: bool,
                  threads: Optional[int]) -> None:
    """Check everything, load the target, run the bench with a progress bar, write the files and render."""
    gguf_path = check_bench(settings)
    conversations = chosen.load()
    paths = files.check()
    if threads is not None:
        apply_threads(threads)
    loaded = load_target(settings.run.load)
    with doing("benchmarking", "no report was written"), server_log_on_failure():
        report = _run_with_progress(loaded, conversations, settings, chosen.source, gguf_path)
    document = report_document(report, loaded)
    show_report(document, as_json, render, paths.write(document))


@contextmanager
def server_log_on_failure() -> Iterator[None]:
    """A llama.cpp server that failed: the last lines of its log on stderr, then the one-line error."""
    try:
        yield
    except LlamaServerError as error:
        if error.log_tail:
            stderr = err_console()
            stderr.print(f"[dim]the last lines of {error.log_path or 'its log'}:[/dim]", highlight=False)
            for line in error.log_tail:
                stderr.print(f"[dim]  {escape(line)}[/dim]", highlight=False, soft_wrap=True)
        raise


def _run_with_progress(loaded, conversations, settings, source, gguf_path):
    from rich import progress as bars  # (rich's live display: loaded when a bench runs, not for --help)

    stderr = err_console()
    progress = bars.Progress(
        bars.TextColumn("[progress.description]{task.description}"),
        bars.BarColumn(),
        bars.MofNCompleteColumn(),
        bars.TimeElapsedColumn(),
        bars.TimeRemainingColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    )
    settle_heap()  # (what loading left alive, out of the collections that would pause timed steps)
    with progress:
        task = progress.add_task("Benchmarking", total=None)

        def on_progress(event) -> None:
            label = "warm-up" if event.phase == "warmup" else f"{event.category}/{event.prompt_id}"
            if event.phase == "done":
                label = "done"
            repeat = f" #{event.repeat + 1}" if settings.repeats > 1 and event.phase == "run" else ""
            progress.update(task, total=event.total, completed=event.done,
                            description=f"{event.method:>10} · {label}{repeat}")

        return run_bench(loaded.model, loaded.tokenizer, conversations, settings, model_name=loaded.name,
                         device=loaded.device, dtype=loaded.dtype, suite=source, on_progress=on_progress,
                         gguf_path=gguf_path)


# ------------------------------------------------------------------------------------------------ the table


def header_lines(document: dict) -> list[str]:
    env, settings = document["environment"], document["settings"]
    cores = f"{env['cpu_cores']} cores"
    if env.get("usable_cores") and env["usable_cores"] != env["cpu_cores"]:
        cores += f" ({env['usable_cores']} usable)"
    mode = "greedy" if settings["greedy"] else f"sampling, temperature {settings['temperature']}"
    kernel = ""  # the C kernels' threads and instruction-set path, where they computed the target
    if env.get("kernel_threads"):
        kernel = f" · kernel threads {env['kernel_threads']}" + (f" ({env['kernel_path']})" if env.get("kernel_path")
                                                                else "")
        kernel += f" · KV cache {env['kv_cache']}" if env.get("kv_cache") == "bfloat16" else ""
    return [
        f"Machine: {env['cpu']} · {cores} · torch threads {env['torch_threads']}{kernel} · GPU: {env['gpu'] or 'none'}",
        f"Software: torch {env['torch']} · transformers {env['transformers']} · specdec {env['specdec']} · "
        f"Python {env['python']}",
        f"Model: {env['model']} · {env['dtype']} · {env['device']} · {mode} · max {settings['max_new_tokens']} "
        f"new tokens · draft budget {settings['engine_draft_max']} · repeats {settings['repeats']}",
        f"Prompts: {settings['prompts']} · {len(settings['categories'])} categories · "
        f"{settings['conversations']} prompts ({settings['turns']} turns) · {env['date']}",
        f"Dtype: {env.get('dtype_choice') or env['dtype']} · weights: {env.get('weights') or 'dense'} · "
        f"exact verification: {settings.get('exact_check', 'off')}",
    ]


def curve_lines(document: dict) -> list[str]:
    """The verify-cost curve the engine planned with, as one or two lines of "rows: ms"."""
    curve = document.get("cost_curve")
    if not curve:
        return []
    label = {"measured": "measured now", "cache": "stored for this machine"}.get(curve["origin"], curve["origin"])
    start = " ".join(f"{rows}:{ms:.1f}" for rows, ms in zip(curve["rows"], curve["start_ms"]) if ms is not None)
    end = " ".join(f"{rows}:{ms:.1f}" for rows, ms in zip(curve["rows"], curve["end_ms"]) if ms is not None)
    lines = [f"Verify cost, ms per forward of N rows ({label}): {start}"]
    if end != start:
        lines.append(f"  refined by this run's steps: {end}")
    return lines


def fastest_plain_lines(results: list[dict], server_plain: Optional[str] = None) -> list[str]:
    """Where `none` is not the fastest plain decoding (row-invariant verification costs plain steps a little):
    by how much, and each drafter's speedup over the fastest plain row instead."""
    overall = {row["method"]: row for row in results if row["category"] == "overall"}
    names = ("none", "native", "hf", "llama.cpp", *((server_plain,) if server_plain else ()))
    plain = {name: overall[name]["tokens_per_second"] for name in names
             if name in overall and overall[name]["tokens_per_second"]}
    if "none" not in plain or max(plain, key=lambda name: plain[name]) == "none":
        return []
    fastest = max(plain, key=lambda name: plain[name])
    drafters = [f"{name} {row['speedup_vs_fastest_plain']:.2f}x" for name, row in overall.items()
                if name not in plain and row.get("speedup_vs_fastest_plain") is not None]
    lines = [f"fastest plain decoding: {fastest} {plain[fastest]:.1f} tok/s; none (specdec's plain decoding) "
             f"{plain['none']:.1f} tok/s, {1 - plain['none'] / plain[fastest]:.0%} slower"]
    if drafters:
        lines.append("speedup over the fastest plain decoding: " + ", ".join(drafters))
    return lines


def llama_cpp_lines(results: list[dict]) -> list[str]:
    """Every row's speed against llama.cpp's plain decoding of the same GGUF, overall and per category."""
    rows = [row for row in results if row.get("speedup_vs_llama_cpp") is not None and row["method"] != "llama.cpp"]
    overall = [f"{row['method']} {row['speedup_vs_llama_cpp']:.2f}x" for row in rows if row["category"] == "overall"]
    lines = ["speed over llama.cpp's plain decoding through its Python binding (overall): " + ", ".join(overall)] \
        if overall else []
    rows = [row for row in results if row.get("speedup_vs_llama_server") is not None and row["category"] == "overall"]
    server = [f"{row['method']} {row['speedup_vs_llama_server']:.2f}x" for row in rows
              if row["speedup_vs_llama_server"] != 1.0 or not is_server_row(row["method"])]
    if server:
        lines.append("speed over llama-server's plain decoding (overall): " + ", ".join(server))
    return lines


def is_server_row(name: str) -> bool:
    return name == "llama-server" or name.startswith(("llama-server:", "llama-server@"))


def is_binding_row(name: str) -> bool:
    return name in ("llama.cpp", "llama.cpp-pld")


def server_lines(document: dict) -> list[str]:
    """What each llama-server row ran, and every row's speed without the prompt (llama.cpp's timings)."""
    servers = document["settings"].get("llama_servers") or {}
    if not servers:
        return []
    lines = []
    for name, info in servers.items():
        where = "started here" if info.get("started_here") else "already running"
        spec = info.get("speculative_types") or info.get("spec_type") or "none"
        count = info.get("threads")
        threads = f", {count} thread{'s' if count != 1 else ''}" if count else ""
        kind = "specdec serve" if str(info.get("build_info") or "").startswith("specdec") else "llama.cpp's server"
        lines.append(f"{name}: {kind} at {info.get('url')} ({where}{threads}; speculative: {spec}); "
                     f"timed by its own timings (prompt_ms + predicted_ms); compared by {info.get('tokens_from')}")
        if info.get("prompt_tokens_reused"):
            lines.append(f"{name}: {info['prompt_tokens_reused']} prompt tokens came from its cache")
    overall = [row for row in document["results"] if row["category"] == "overall"
               and row.get("decode_tokens_per_second") is not None]
    if overall:
        lines.append("tokens/s without the prompt (new tokens ÷ the time after the first; llama-server: "
                     "predicted_n ÷ predicted_ms): " + ", ".join(f"{row['method']} {row['decode_tokens_per_second']:.1f}"
                                                             for row in overall))
    return lines


COLUMNS: list[tuple[str, Literal["left", "right"]]] = [
    ("Category", "left"), ("Method", "left"), ("Prompts", "right"), ("Tokens", "right"), ("Seconds", "right"),
    ("Tok/s", "right"), ("Speedup", "right"), ("τ", "right"), ("Accept", "right"), ("Draft/Verify", "right"),
    ("TTFT", "right"), ("Identical", "right")]
LEGEND = ("speedup = tokens/s ÷ none's tokens/s on the same prompts · τ = tokens per target forward · "
          "Draft/Verify = share of wall time · Identical = outputs token-equal to none (greedy)")
LLAMA_LEGEND = ("(binding) = llama.cpp through its Python binding, llama-cpp-python, timed around the call · "
                "llama-server = llama.cpp's own server binary, timed by its per-request timings")
SHOWN_DIVERGENCES = 5  # outputs that differ from none's, listed one a line; the rest counted


def render(document: dict) -> None:
    """The bench's table on stdout: its header lines, the rows, then the footnotes (dim) and warnings (yellow)."""
    out = console()
    for line in header_lines(document) + curve_lines(document):
        out.print(f"[dim]{line}[/dim]", soft_wrap=not out.is_terminal)
    table = results_table(document)
    if not out.is_terminal:  # a log or a pipe: every column whole, however wide the table
        out.width = max(out.width, table_width(out, table))
    out.print(table)
    for style, line in footnotes(document):
        out.print(f"[{style}]{line}[/{style}]", soft_wrap=not out.is_terminal)
    for line in divergence_lines(document):
        out.print(f"[yellow]{line}[/yellow]")
    if document.get("batched"):
        out.print(batched_table(document["batched"]))


def batched_table(rows: list[dict]) -> Table:
    """--batch N: each engine row's first turns answered N at a time, beside the same answers one at a time."""
    table = Table(title=f"first turns, {rows[0]['width']} at a time (one forward a step for all)", pad_edge=False)
    for name in ("Method", "Prompts", "Tokens", "Seconds", "tok/s", "tok/s alone", "x alone", "Identical to alone"):
        table.add_column(name, justify="left" if name == "Method" else "right", no_wrap=True)
    for row in rows:
        alone = row["alone_tokens_per_second"]
        identical = f"{row['identical']}/{row['compared']}"
        table.add_row(row["method"], str(row["prompts"]), str(row["new_tokens"]), cell(row["seconds"], ".1f"),
                      cell(row["tokens_per_second"], ".1f"), cell(alone, ".1f"),
                      cell(row["tokens_per_second"] / alone if alone else None, ".2f", "x"),
                      identical if row["identical"] == row["compared"] else f"[yellow]{identical}[/yellow]")
    return table


def results_table(document: dict) -> Table:
    """One row a method and category, a section a category, the overall rows bold."""
    table = Table(show_lines=False, pad_edge=False)
    for name, justify in COLUMNS:
        table.add_column(name, justify=justify, no_wrap=True)
    repeats, greedy = document["settings"]["repeats"], document["settings"]["greedy"]
    previous = None
    for row in document["results"]:
        if previous is not None and row["category"] != previous:
            table.add_section()
        category = row["category"] if row["category"] != previous else ""
        previous = row["category"]
        table.add_row(category, *row_cells(row, repeats, greedy),
                      style="bold" if row["category"] == "overall" else None)
    return table


def row_cells(row: dict, repeats: int, greedy: bool) -> list[str]:
    """A result row's cells from Method on: a mean ± std over repeats, a yellow Identical where greedy outputs
    differ."""
    tps = cell(row["tokens_per_second"], ".1f")
    speedup = cell(row["speedup"], ".2f", "x")
    if repeats > 1:
        tps += f" ±{row['tokens_per_second_std']:.1f}"
        speedup += f" ±{row['speedup_std']:.2f}"
    shares = "–" if row["draft_share"] is None else f"{row['draft_share']:.0%}/{row['verify_share']:.0%}"
    identical = "–" if row["identical"] is None else f"{row['identical']}/{row['compared']}"
    if greedy and row["identical"] is not None and row["identical"] < row["compared"]:
        identical = f"[yellow]{identical}[/yellow]"
    label = f"{row['method']} (binding)" if is_binding_row(row["method"]) else row["method"]
    ttft = None if row["ttft_seconds"] is None else row["ttft_seconds"] * 1000
    return [label, str(row["prompts"]), str(row["new_tokens"]), cell(row["seconds"], ".1f"), tps, speedup,
            cell(row["mean_accepted_tokens"], ".2f"), cell(row["acceptance_rate"], ".0%"), shares,
            cell(ttft, ".0f", " ms"), identical]


def footnotes(document: dict) -> list[tuple[str, str]]:
    """(style, line) under the table: the legends, the memory and skipped-row warnings, the comparisons with
    llama.cpp and the fastest plain decoding, the servers, and why plain rows on other kernels differ."""
    settings, results = document["settings"], document["results"]
    names = [row["method"] for row in results if row["category"] == "overall"]
    lines = [("dim", LEGEND)]
    if any(is_binding_row(name) or is_server_row(name) for name in names):
        lines.append(("dim", LLAMA_LEGEND))
    remembered = settings.get("memory")
    if remembered and remembered.get("answers_to_measured_prompts"):
        lines.append(("yellow", f"memory: {remembered['answers_to_measured_prompts']} of its {remembered['answers']} "
                                "answers answer prompts measured here: sam's speed on them is not what new prompts "
                                "would see"))
    lines += [("yellow", f"{name}: skipped: {reason}")
              for name, reason in (settings.get("references_skipped") or {}).items()]
    compared = llama_cpp_lines(results) + fastest_plain_lines(results, settings.get("llama_server_plain")) \
        + server_lines(document)
    return lines + [("dim", line) for line in compared + own_kernel_lines(document)]


def own_kernels(settings: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(rows decoding plainly on kernels other than the engine's row-invariant ones, those of them that are another
    program's): their outputs may differ from none's by rounding alone."""
    exact = str(settings.get("exact_check", "")).startswith("on")
    outside = ("llama.cpp", "llama.cpp-pld", *tuple(settings.get("llama_servers") or ()))
    return (("native", "hf", "hf-pld", *outside) if exact else outside), outside


def own_kernel_lines(document: dict) -> list[str]:
    """Why a plain row on its own kernels is not token-equal to none everywhere (both are greedy decoding)."""
    kernels, outside = own_kernels(document["settings"])
    lines = []
    for row in document["results"]:
        if row["category"] == "overall" and row["method"] in kernels and row["identical"] is not None:
            why = ("llama.cpp computes with its own kernels and rounding" if row["method"] in outside else
                   "the model's own kernels round differently from the row-invariant ones")
            lines.append(f"{row['method']}: {row['identical']}/{row['compared']} outputs equal none's: {why} (both "
                         "are greedy decoding of the same weights)")
    return lines


def divergence_lines(document: dict) -> list[str]:
    """The first outputs that differ from none's (the engine's own rows: a bug if greedy), then how many more."""
    kernels, _ = own_kernels(document["settings"])
    diverged = [row for row in document["per_prompt"] if row["identical"] is False and row["method"] not in kernels]
    lines = [f"{row['method']}: prompt {row['prompt_id']} turn {row['turn']} differs from none at token "
             f"{row['first_divergence']}" for row in diverged[:SHOWN_DIVERGENCES]]
    if len(diverged) > SHOWN_DIVERGENCES:
        lines.append(f"… and {len(diverged) - SHOWN_DIVERGENCES} more outputs differ (see per_prompt in --json-out)")
    return lines
