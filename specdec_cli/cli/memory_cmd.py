"""`specdec memory`: what the answer memory holds (`info`), `clear`, `export` (a build-index corpus), `import`.

Thin layer over specdec_cli/texts/memory.py: each command loads the target's tokenizer (no model), opens that
target's memory and calls one function.
"""

from __future__ import annotations

import time
from typing import Optional

import typer

from ..texts.memory import check_export_output, export_corpus, import_file, memory_enabled, open_memory
from . import app, options
from .common import console, doing, err_console

memory_app = typer.Typer(help="The answer memory `sam` drafts from: info, clear, export, import.",
                         no_args_is_help=True)
app.add_typer(memory_app, name="memory")

TARGET = options.target(whose="Whose memory: ")


def _age(stamp: Optional[float]) -> str:
    if stamp is None:
        return "-"
    seconds = max(0.0, time.time() - stamp)
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit} ago"
    return f"{seconds:.0f} seconds ago"


@memory_app.command("info")
def info(target: str = TARGET, as_json: bool = options.as_json("the memory's details")) -> None:
    """Answers, tokens, size and age of the target's memory."""
    import json

    memory, _ = open_memory(target)
    details = memory.info()
    details["enabled"] = memory_enabled()
    if as_json:
        print(json.dumps(details))
        return
    out = console()
    out.print(f"memory of {target}: {details['directory']}")
    out.print(f"  {details['answers']:,} answers · {details['tokens']:,} tokens (cap {details['cap_tokens']:,}) · "
              f"{details['bytes'] / 1e6:.1f} MB · oldest {_age(details['oldest'])} · newest {_age(details['newest'])}")
    if not details["enabled"]:
        out.print("  off: SPECDEC_NO_MEMORY is set")


@memory_app.command("clear")
def clear(target: str = TARGET) -> None:
    """Forget every remembered answer of the target."""
    memory, _ = open_memory(target)
    err_console().print(f"cleared {memory.clear():,} answers from {memory.directory}", soft_wrap=True)


@memory_app.command("export")
def export(path: str = typer.Argument(..., help="JSONL file to write ({\"text\": ...} per answer)."),
           target: str = TARGET,
           force: bool = typer.Option(False, "--force", help="Replace an existing file that is not an unchanged "
                                      "earlier export (an earlier export is replaced anyway).")) -> None:
    """Write the remembered answers as a corpus for `specdec build-index`."""
    check_export_output(path, force)  # before the tokenizer loads: never over a file that is not ours
    memory, tokenizer = open_memory(target)
    with doing("exporting the memory"):
        count = export_corpus(memory, tokenizer, path)
    err_console().print(f"wrote {count:,} answers to {path}", soft_wrap=True)


@memory_app.command("import")
def import_(path: str = typer.Argument(..., help="A `specdec distill generate` output, or any corpus (text, JSONL, folder)."),
            target: str = TARGET) -> None:
    """Remember answers from a file: a `distill generate` output as it is, any other corpus tokenized once."""
    memory, tokenizer = open_memory(target)
    with doing("importing into the memory", "what was imported so far is kept"):
        answers, tokens = import_file(memory, tokenizer, path)
    err_console().print(f"remembered {answers:,} answers ({tokens:,} tokens) in {memory.directory}", soft_wrap=True)
