"""Shared pieces of the CLI layer: lazily created Rich consoles and the one-line error printer."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence, Union

from .. import machine
from ..bench.report import to_json_text
from ..errors import flag_of
from ..files import TEMP_MARK
from ..home import specdec_home
from ..target_model.load import models
from ..target_model.placement import set_threads

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from ..errors import SpecdecError


def no_color() -> bool:
    """NO_COLOR set and not empty (no-color.org): no ANSI styling at all, neither colours nor bold, dim or strike."""
    return os.environ.get("NO_COLOR", "") != ""


@lru_cache(maxsize=None)
def console() -> "Console":
    """Console for results on stdout (honours NO_COLOR and non-terminal stdout)."""
    from rich.console import Console

    # Rich's no_color drops colours only; without a colour system it writes no styling at all
    return Console(highlight=False, no_color=no_color(), color_system=None if no_color() else "auto")


@lru_cache(maxsize=None)
def err_console() -> "Console":
    """Console for progress, status and messages on stderr, so stdout stays clean for --json (honours NO_COLOR)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, no_color=no_color(), color_system=None if no_color() else "auto")


_activity: list[tuple[str, Union[str, Callable[[], str]]]] = []  # what the command is doing now, what Ctrl-C keeps
_interrupted_during: list[str] = []  # the innermost activity an interruption unwound through


def cell(value, spec: str = ".2f", suffix: str = "") -> str:
    """A table cell: the value formatted, or a dash where there is none."""
    return "–" if value is None else f"{value:{spec}}{suffix}"


def table_width(out, table) -> int:
    """Columns a table needs with no cell cut short."""
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update(width=10_000), table).maximum


@contextmanager
def doing(what: str, kept: Union[str, Callable[[], str]] = "nothing was written") -> Iterator[None]:
    """Name the slow part a command is in, so Ctrl-C (or SIGTERM) is reported as "interrupted while ...; KEPT".
    `kept` may be a function, asked when the interruption comes (what was written depends on when)."""
    _activity.append((what, kept))
    try:
        yield
    except KeyboardInterrupt:
        if not _interrupted_during:
            _interrupted_during.append(_describe(*_activity[-1]))
        raise
    finally:
        _activity.pop()


def _describe(what: str, kept: Union[str, Callable[[], str]]) -> str:
    return f"while {what}; {kept() if callable(kept) else kept}"


def interruption_message(signal_name: str = "") -> str:
    prefix = f"{signal_name}: " if signal_name else ""
    if _interrupted_during:
        return f"{prefix}interrupted {_interrupted_during[-1]}"
    return f"{prefix}interrupted {_describe(*_activity[-1])}" if _activity else f"{prefix}interrupted"


def cache_kept_since() -> Callable[[], str]:
    """For `doing` around a model load: what an interruption keeps, judged then. A GGUF converted (or block
    weights planned) since this call is in $SPECDEC_HOME and kept (later loads skip the work); else nothing."""
    folders = ("models", "weights")

    def entries() -> set[Path]:
        found: set[Path] = set()
        for name in folders:
            try:
                found |= {entry for entry in (specdec_home() / name).iterdir() if TEMP_MARK not in entry.name}
            except OSError:
                pass
        return found

    before = entries()

    def kept() -> str:
        new = sorted(entries() - before)
        if not new:
            return "nothing was converted"
        where = str(new[0]) if len(new) == 1 else f"{len(new)} entries under {specdec_home()}"
        return f"the conversion finished and is kept in {where} (later loads skip it)"

    return kept


def flag_message(exc: "SpecdecError") -> str:
    """A library error as the command line says it: the setting's name spelled as its flag."""
    return exc.naming(flag_of(exc.setting)) if exc.setting else str(exc)


def apply_threads(threads: int) -> None:
    """--threads: pin torch's CPU threads, warning when there are more threads than cores to run them."""
    set_threads(threads)
    cores = machine.usable_cores()
    if cores and threads > cores:
        sys.stderr.write(f"specdec: warning: --threads {threads} is more than the {cores} cores this process may "
                         "use; threads competing for cores are much slower\n")  # one line, never wrapped
        sys.stderr.flush()


def apply_kv_cache(kv_cache: "str | None") -> None:
    """--kv-cache: the native decoder's KV cache dtype for this process and the processes it starts (it sets
    SPECDEC_KV_CACHE, which the decoder and the stored cost curves read: native/kv_cache.py)."""
    if kv_cache is not None:
        os.environ["SPECDEC_KV_CACHE"] = kv_cache


def print_error(message: str) -> None:
    """One line on stderr: `specdec: error: ...`."""
    first = " ".join(str(message).strip().split("\n")[0].split())
    sys.stderr.write(f"specdec: error: {first}\n")
    sys.stderr.flush()


def say_loaded(loaded) -> None:
    """The load line on stderr in a terminal (what loading did: file, family, types, where the weights live,
    memory, time); where stderr is a file or a pipe it stays quiet, as the spinner does (`--json` outputs carry
    the line as `load`)."""
    if getattr(loaded, "load_line", "") and err_console().is_terminal:
        err_console().print(f"[dim]{loaded.load_line}[/dim]", highlight=False, soft_wrap=True)


def load_target(settings: Any, for_engine: bool = True) -> Any:
    """Load the target as `settings` (a LoadSettings) say (target_model.load.models.load) under a spinner on
    stderr, then the load line; `for_engine` false: distill's (no device engine)."""
    status = err_console().status("Loading model…")
    with status:
        loaded = models.load(settings, on_status=lambda message: status.update(message), for_engine=for_engine)
    say_loaded(loaded)
    return loaded


def show_report(document: dict, as_json: bool, render: Callable[[dict], None], written: Sequence[Path]) -> None:
    """A bench's report on stdout, as JSON (--json) or as its table (`render`); then each file written, on stderr."""
    if as_json:
        print(to_json_text(document), end="")
    else:
        render(document)
    for path in written:
        err_console().print(f"[dim]wrote {path}[/dim]")


def progress_bars(*fields: str) -> Any:
    """One progress line on stderr in a terminal; nothing at all where stderr is a file or a pipe."""
    from rich import progress as bars

    columns = [bars.TextColumn("[bold]{task.description}"), bars.BarColumn(), bars.MofNCompleteColumn()]
    columns += [bars.TextColumn(f"{{task.fields[{name}]}}") for name in fields]
    columns += [bars.TimeElapsedColumn(), bars.TextColumn("eta"), bars.TimeRemainingColumn()]
    return bars.Progress(*columns, console=err_console(), transient=False, disable=not err_console().is_terminal)


def tell(text: str) -> None:
    """One message on stderr, one line however long (a terminal wraps it; a log keeps it whole)."""
    err_console().print(text, soft_wrap=True)


def notes(progress: Any) -> Callable[[str], None]:
    """Print a library's messages above a progress line; where stderr is not a terminal, leave out its notes of
    progress (those that end with "…"), as the bar itself is left out."""
    def say(message: str) -> None:
        if progress.console.is_terminal or not message.endswith("…"):
            progress.console.print(message, soft_wrap=True)

    return say
