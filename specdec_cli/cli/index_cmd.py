"""`specdec build-index`: build a static suffix-automaton index from a corpus, or describe one (`--info`).

Thin layer: parse the flags, check the inputs, load the target's tokenizer, call
`specdec_cli.texts.corpus.build_index` with a Rich progress display (tokens/s, on stderr), and print a summary.
`--info FILE` reads only the index header: no model, no tokenizer, no torch.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Callable, Iterator, Optional

import typer

from ..errors import SpecdecError
from ..target_model.load import models
from . import app, options
from .common import console, doing, err_console


def _size(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1024 or unit == "GB":
            return f"{num_bytes:,.0f} {unit}" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:,.1f} GB"  # pragma: no cover


def _table(title: str, rows: list[tuple[str, str]]) -> Any:
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    return table


def _show_info(path: str, as_json: bool, verify: bool = False) -> None:
    from ..sam.index import read_index_info, verify_index

    info = verify_index(path) if verify else read_index_info(path)
    if as_json:
        console().print_json(json.dumps(info))
        return
    tokens = info["tokens"]
    build = info.get("build", {})
    sources = info.get("sources", [])
    rows = [
        ("format", f"{info['format']} v{info['format_version']}"),
        ("created", f"{info.get('created', '?')} by specdec {info.get('specdec_version', '?')}"),
        ("target", str(build.get("target", "?"))),
        ("tokenizer", f"{info['tokenizer_fingerprint']} ({build.get('tokenizer_class', '?')})"),
        ("vocabulary", f"{info['vocab_size']:,} tokens, EOS id {info['eos_id']}"),
        ("documents", f"{info.get('documents', 0):,}"),
        ("tokens", f"{tokens:,}"),
        ("states", f"{info['states']:,} ({info['states_per_token']:.2f} per token)"),
        ("transitions", f"{info['transitions']:,} ({info['transitions_per_token']:.2f} per token)"),
        ("file", f"{_size(info['file_bytes'])} ({info['bytes_per_token']:.1f} bytes per token)"),
        ("sources", f"{len(sources):,} files, {_size(sum(s.get('size', 0) for s in sources))}"),
    ]
    if verify:
        rows.append(("checksum", {"ok": "every byte verified (CRC-32)",
                                  "absent": "none recorded (built by an older specdec): structure checked only"}
                     [info["checksum"]]))
    for source in sources[:5]:
        rows.append(("", f"{source['path']}  sha256:{source.get('sha256', '')[:12]}"))
    if len(sources) > 5:
        rows.append(("", f"... and {len(sources) - 5} more"))
    console().print(_table(str(path), rows))


def _show_summary(summary: dict[str, Any]) -> None:
    tokens = summary["tokens"]
    rows = [
        ("documents", f"{summary['documents']:,}"),
        ("tokens", f"{tokens:,}"),
        ("states", f"{summary['states']:,} ({summary['states'] / tokens:.2f} per token)"),
        ("transitions", f"{summary['transitions']:,} ({summary['transitions'] / tokens:.2f} per token)"),
        ("file", f"{_size(summary['file_bytes'])} ({summary['bytes_per_token']:.1f} bytes per token)"),
        ("tokenise", f"{summary['tokenize_seconds']:.2f} s ({tokens / max(summary['tokenize_seconds'], 1e-9):,.0f} tokens/s)"),
        ("build", f"{summary['build_seconds']:.2f} s"),
        ("write", f"{summary['write_seconds']:.2f} s"),
        ("total", f"{summary['seconds']:.2f} s"),
    ]
    if summary.get("skipped_rows"):
        rows.append(("skipped rows", f"{summary['skipped_rows']:,} (no text)"))
    skipped = summary.get("skipped_files") or []
    if skipped:
        more = f", and {len(skipped) - 3:,} more" if len(skipped) > 3 else ""
        rows.append(("skipped files", f"{len(skipped):,} found in directories, not UTF-8 text: "
                                      f"{', '.join(skipped[:3])}{more}"))
    console().print(_table(f"Index written to {summary['output']}", rows))


@app.command("build-index")
def build_index_command(
    corpus: Optional[list[str]] = typer.Argument(
        None, metavar="CORPUS", help="Text files, .jsonl files, directories (searched with --glob), or - for stdin."
    ),
    output: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE", help="Index file to write."),
    target: str = options.target(whose="Model whose tokenizer is used: "),
    field: str = typer.Option("text", "--field", help="Field holding the text in .jsonl rows."),
    glob: str = typer.Option("*.txt", "--glob", help="Which files to take from directories (recursive)."),
    info: Optional[str] = typer.Option(
        None, "--info", metavar="FILE", help="Describe an existing index (reads only its header) and exit."
    ),
    verify: Optional[str] = typer.Option(
        None, "--verify", metavar="FILE", help="Check every byte of an existing index against its checksum, and exit."
    ),
    as_json: bool = options.as_json("the summary (or the --info, --verify result)"),
    force: bool = typer.Option(
        False, "--force", help="Replace an -o file that is not a specdec index (an existing index is replaced anyway)."
    ),
) -> None:
    """Build a static suffix-automaton index (the `sam` drafter's --index) from a corpus."""
    if info is not None or verify is not None:
        if corpus or output or (info and verify):
            raise SpecdecError("--info and --verify read one existing index; give no corpus and no -o with them")
        _show_info(str(info or verify), as_json, verify=verify is not None)
        return
    if not corpus:
        raise SpecdecError("no corpus given: name files, directories or - (stdin); see --help")
    if not output:
        raise SpecdecError("no output file: add -o FILE")
    from ..texts.corpus import build_index  # (numpy)
    from ..texts.corpus_inputs import check_index_build

    check_index_build(corpus, output, glob, force)  # before the tokenizer loads
    tokenizer = _load_tokenizer(target)
    with _indexing_progress() as (on_progress, on_phase), \
            doing("building the index", f"no index was written to {output}"):
        summary = build_index(corpus, output, tokenizer, field=field, glob=glob, target_name=target,
                              on_progress=on_progress, on_phase=on_phase, force=force)
    if as_json:
        console().print_json(json.dumps(summary))
    else:
        _show_summary(summary)


def _load_tokenizer(target: str) -> Any:
    """The target's tokenizer, under a spinner on a terminal (a redirected stderr gets errors alone)."""
    status = err_console()
    with status.status(f"Loading the tokenizer of {target}") if status.is_terminal else contextlib.nullcontext():
        return models.load_tokenizer(target, on_status=lambda message: status.print(message))


@contextlib.contextmanager
def _indexing_progress() -> Iterator[tuple[Callable[[int, int], None], Callable[[str], None]]]:
    """(on_progress, on_phase) for build_index, drawing tokens, documents and tokens/s on stderr (a terminal only)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # (loaded when it builds)

    status = err_console()
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[tokens]:,} tokens · {task.fields[documents]:,} docs · {task.fields[rate]:,.0f} tokens/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=status, transient=True, disable=not status.is_terminal) as progress:
        task = progress.add_task("Tokenising", tokens=0, documents=0, rate=0.0)
        started = time.perf_counter()
        drawn = [0.0]  # when the display was last redrawn from here

        def on_progress(tokens_done: int, documents_done: int) -> None:
            now = time.perf_counter()
            rate = tokens_done / max(now - started, 1e-9)
            # redrawn from the caller too (at most 10 times a second): on a busy machine the display's own
            # refresh thread can starve while the tokenizer holds the interpreter
            redraw = now - drawn[0] >= 0.1
            if redraw:
                drawn[0] = now
            progress.update(task, tokens=tokens_done, documents=documents_done, rate=rate, refresh=redraw)

        def on_phase(phase: str) -> None:
            progress.update(task, description=phase)

        yield on_progress, on_phase
