"""`specdec bench`: plain decoding, the chosen drafters and reference rows on the same prompts, one process.

Thin layer: flags -> prompts and BenchSettings (checked before the slow model load) -> bench.run_bench with
a Rich progress bar on stderr -> files (--json-out, --csv, --plot) and a Rich table (or --json) on stdout.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal, NamedTuple, Optional

import typer

from ..defaults import DEFAULT_BENCH_MAX_NEW_TOKENS, VLLM_DRAFTERS
from ..vllm.runner import VLLM_METHODS
from . import app, options
from .common import apply_threads, cell, console, doing, err_console, say_loaded, table_width

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
    memory: Optional[str] = typer.Option(None, "--memory", help="Let sam draft from this answer-memory directory (`specdec memory info` shows it); the bench never reads or writes the memory otherwise."),
    exact: Optional[bool] = options.exact(note="; when on, the `native` row times plain decoding on the model's own kernels"),
    engine: str = options.choice("specdec", "--engine", options.ENGINES, help="specdec (this process), or vllm: the methods inside vLLM "
                               f"(each in its own vLLM process; drafters {', '.join(VLLM_DRAFTERS)}; --reference "
                               f"{','.join(VLLM_METHODS)} for vLLM's own, default ngram), one request at a time and "
                               "--concurrency at once. Needs `make install-vllm`."),
    concurrency: int = typer.Option(8, "--concurrency", help="--engine vllm: requests in flight in the concurrent "
                                    "rows (a new one as one finishes)."),
) -> None:
    """Measure speedup over plain decoding on a prompt suite (Spec-Bench conventions: greedy, batch 1, warm-up excluded)."""
    from ..bench import parse_lengths, resolve_methods, split_names
    from ..bench.settings import bench_settings

    options.check_engine(engine)
    chosen = PromptChoice(suite if suite or prompts else DEFAULT_SUITE, prompts, categories, limit)
    outputs = Outputs(json_out, csv_out, plot, as_json, force)
    values = dict(target=target, device=device, decoder=decoder, dtype=dtype, weights=weights, index=index, aux=aux,
                  l_threshold=l_threshold, draft_model=draft_model, draft_min_prob=draft_min_prob, memory=memory,
                  draft_max=draft_max, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                  exact=exact, raw=raw, warmup=warmup)  # named as the settings' fields (bench/settings.py)
    if engine == "vllm":
        from .bench_vllm import bench_vllm

        not_here = {"--oracle": oracle, "--temperature": temperature > 0, "--repeats": repeats > 1,
                    "--draft-model": draft_model, "--plot": plot, "--exact/--no-exact": exact is not None,
                    "--weights": weights != "auto", "--threads": threads is not None, "--device": device != "auto",
                    "--decoder": decoder != "auto"}
        bench_vllm(values, split_names(drafters), split_names(reference), chosen, outputs, concurrency=concurrency,
                   unsupported=[flag for flag, used in not_here.items() if used])
        return
    # Everything a user can get wrong is checked before the model loads.
    lengths = parse_lengths(oracle_lengths) if oracle else []
    if not split_names(drafters):
        from ..errors import SpecdecError

        raise SpecdecError("--drafters: give at least one name (none: plain decoding alone)", setting="drafters")
    settings = bench_settings(resolve_methods(split_names(drafters), split_names(reference), lengths),
                              repeats=repeats, llama_server=llama_server, **values)
    bench_specdec(settings, chosen, outputs, threads)


class PromptChoice(NamedTuple):
    """Which prompts a bench runs: --suite or --prompts, then --categories and --limit."""

    suite: Optional[str]
    prompts: Optional[str]
    categories: Optional[str]
    limit: Optional[int]

    def load(self) -> list:
        from ..texts.prompts import load_prompts

        wanted = [name.strip() for name in (self.categories or "").split(",") if name.strip()]
        return load_prompts(self.prompts, self.suite, categories=wanted, limit=self.limit)


class Outputs(NamedTuple):
    """Where a bench's report goes besides the table: --json-out, --csv, --plot, and --json instead of the table."""

    json_out: Optional[str]
    csv_out: Optional[str]
    plot: Optional[str]
    as_json: bool
    force: bool = False


def bench_specdec(settings, chosen: PromptChoice, outputs: Outputs, threads: Optional[int]) -> None:
    """Check everything, load the target, run the bench with a progress bar, write the files and render."""
    from ..bench import llama_server_rows, run_bench, to_json_text, write_csv, write_json
    from ..files import check_output_file
    from ..target_model.load.models import check_load, load_target

    settings.check()
    load = settings.run.load
    source_file = check_load(load).source  # loads nothing yet
    gguf_path = source_file.location if source_file.kind == "gguf" else None
    llama_server_rows(settings.methods, settings.llama_server, gguf_path)  # a bad --llama-server, a silent URL
    conversations = chosen.load()
    source = chosen.prompts or str(chosen.suite).strip().lower()
    json_path = check_output_file(outputs.json_out, "json_out", force=outputs.force, force_flag="--force") \
        if outputs.json_out else None
    csv_path = check_output_file(outputs.csv_out, "csv", force=outputs.force, force_flag="--force") \
        if outputs.csv_out else None
    if outputs.plot:
        from ..bench.plots import check_plot_dir, require_matplotlib

        require_matplotlib()
        check_plot_dir(outputs.plot, outputs.force)

    if threads is not None:
        apply_threads(threads)
    status = err_console().status("Loading model…")
    with status:
        loaded = load_target(load.target, load.device, load.dtype, on_status=lambda message: status.update(message),
                             weights=load.weights, decoder=load.decoder)
    say_loaded(loaded)
    with doing("benchmarking", "no report was written"), server_log_on_failure():
        report = _run_with_progress(run_bench, loaded, conversations, settings, source, gguf_path)
    document = report.as_json()
    document["environment"]["dtype_choice"] = loaded.dtype_reason
    document["environment"]["weights"] = loaded.weights_reason
    document["environment"]["load"] = loaded.load_line
    if loaded.weights == "dense":  # the kernel threads matter only where the kernels compute the target
        document["environment"]["kernel_threads"] = None

    if json_path:
        write_json(document, json_path)
    if csv_path:
        write_csv(document["results"], csv_path)
    written = []
    if outputs.plot:
        from ..bench.plots import write_plots

        written = write_plots(document, outputs.plot)
    if outputs.as_json:
        print(to_json_text(document), end="")
    else:
        render(document)
    for path in [json_path, csv_path, *written]:
        if path:
            err_console().print(f"[dim]wrote {path}[/dim]")


@contextmanager
def server_log_on_failure() -> Iterator[None]:
    """A llama.cpp server that failed: the last lines of its log on stderr, then the one-line error."""
    from rich.markup import escape

    from ..bench.llama_server import LlamaServerError

    try:
        yield
    except LlamaServerError as error:
        if error.log_tail:
            stderr = err_console()
            stderr.print(f"[dim]the last lines of {error.log_path or 'its log'}:[/dim]", highlight=False)
            for line in error.log_tail:
                stderr.print(f"[dim]  {escape(line)}[/dim]", highlight=False, soft_wrap=True)
        raise


def _run_with_progress(run_bench, loaded, conversations, settings, source, gguf_path):
    from rich import progress as bars

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
    return [
        f"Machine: {env['cpu']} · {cores} · torch threads {env['torch_threads']}"
        + (f" · kernel threads {env['kernel_threads']}" if env.get("kernel_threads") else "")
        + f" · GPU: {env['gpu'] or 'none'}",
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


def render(document: dict) -> None:
    from rich.table import Table

    out = console()
    for line in header_lines(document) + curve_lines(document):
        out.print(f"[dim]{line}[/dim]", soft_wrap=not out.is_terminal)
    repeats = document["settings"]["repeats"]
    greedy = document["settings"]["greedy"]
    table = Table(show_lines=False, pad_edge=False)
    columns: list[tuple[str, Literal["left", "right"]]] = [("Category", "left"), ("Method", "left"), ("Prompts", "right"), ("Tokens", "right"),
                          ("Seconds", "right"), ("Tok/s", "right"), ("Speedup", "right"), ("τ", "right"),
                          ("Accept", "right"), ("Draft/Verify", "right"), ("TTFT", "right"),
                          ("Identical", "right")]
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    previous = None
    for row in document["results"]:
        if previous is not None and row["category"] != previous:
            table.add_section()
        category = row["category"] if row["category"] != previous else ""
        previous = row["category"]
        tps = cell(row["tokens_per_second"], ".1f")
        speedup = cell(row["speedup"], ".2f", "x")
        if repeats > 1:
            tps += f" ±{row['tokens_per_second_std']:.1f}"
            speedup += f" ±{row['speedup_std']:.2f}"
        shares = "–" if row["draft_share"] is None else f"{row['draft_share']:.0%}/{row['verify_share']:.0%}"
        identical = "–" if row["identical"] is None else f"{row['identical']}/{row['compared']}"
        if greedy and row["identical"] is not None and row["identical"] < row["compared"]:
            identical = f"[yellow]{identical}[/yellow]"
        style = "bold" if row["category"] == "overall" else None
        label = f"{row['method']} (binding)" if is_binding_row(row["method"]) else row["method"]
        table.add_row(
            category, label, str(row["prompts"]), str(row["new_tokens"]), cell(row["seconds"], ".1f"), tps,
            speedup, cell(row["mean_accepted_tokens"], ".2f"), cell(row["acceptance_rate"], ".0%"), shares,
            cell(None if row["ttft_seconds"] is None else row["ttft_seconds"] * 1000, ".0f", " ms"), identical,
            style=style,
        )
    if not out.is_terminal:  # a log or a pipe: every column whole, however wide the table
        out.width = max(out.width, table_width(out, table))
    out.print(table)
    out.print("[dim]speedup = tokens/s ÷ none's tokens/s on the same prompts · τ = tokens per target forward · "
              "Draft/Verify = share of wall time · Identical = outputs token-equal to none (greedy)[/dim]",
              soft_wrap=not out.is_terminal)
    names = [row["method"] for row in document["results"] if row["category"] == "overall"]
    if any(is_binding_row(name) for name in names) or any(is_server_row(name) for name in names):
        out.print("[dim](binding) = llama.cpp through its Python binding, llama-cpp-python, timed around the call · "
                  "llama-server = llama.cpp's own server binary, timed by its per-request timings[/dim]",
                  soft_wrap=not out.is_terminal)
    remembered = document["settings"].get("memory")
    if remembered and remembered.get("answers_to_measured_prompts"):
        out.print(f"[yellow]memory: {remembered['answers_to_measured_prompts']} of its {remembered['answers']} answers "
                  "answer prompts measured here: sam's speed on them is not what new prompts would see[/yellow]",
                  soft_wrap=not out.is_terminal)
    for name, reason in (document["settings"].get("references_skipped") or {}).items():
        out.print(f"[yellow]{name}: skipped: {reason}[/yellow]", soft_wrap=not out.is_terminal)
    server_plain = document["settings"].get("llama_server_plain")
    for line in (llama_cpp_lines(document["results"]) + fastest_plain_lines(document["results"], server_plain)
                 + server_lines(document)):
        out.print(f"[dim]{line}[/dim]", soft_wrap=not out.is_terminal)
    exact = str(document["settings"].get("exact_check", "")).startswith("on")
    servers = tuple(document["settings"].get("llama_servers") or ())
    outside = ("llama.cpp", "llama.cpp-pld", *servers)  # another program's kernels: its rounding is its own
    own_kernels = ("native", "hf", "hf-pld", *outside) if exact else outside  # plain decoding rounding its own way
    for row in document["results"]:
        if row["category"] == "overall" and row["method"] in own_kernels and row["identical"] is not None:
            why = ("llama.cpp computes with its own kernels and rounding" if row["method"] in outside else
                   "the model's own kernels round differently from the row-invariant ones")
            out.print(f"[dim]{row['method']}: {row['identical']}/{row['compared']} outputs equal none's: {why} (both "
                      "are greedy decoding of the same weights)[/dim]", soft_wrap=not out.is_terminal)
    diverged = [row for row in document["per_prompt"] if row["identical"] is False and row["method"] not in own_kernels]
    for row in diverged[:5]:
        out.print(f"[yellow]{row['method']}: prompt {row['prompt_id']} turn {row['turn']} differs from none at "
                  f"token {row['first_divergence']}[/yellow]")
    if len(diverged) > 5:
        out.print(f"[yellow]… and {len(diverged) - 5} more outputs differ (see per_prompt in --json-out)[/yellow]")
