"""Shared pieces of the CLI layer: lazily created Rich consoles and the one-line error printer."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from ..errors import SpecdecError


@lru_cache(maxsize=None)
def console() -> "Console":
    """Console for results on stdout (honours NO_COLOR and non-terminal stdout)."""
    from rich.console import Console

    return Console(highlight=False, no_color="NO_COLOR" in os.environ)


@lru_cache(maxsize=None)
def err_console() -> "Console":
    """Console for progress, status and messages on stderr, so stdout stays clean for --json."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, no_color="NO_COLOR" in os.environ)


_activity: list[str] = []  # what the command is doing now, and what an interruption keeps
_interrupted_during: list[str] = []  # the innermost activity an interruption unwound through


def cell(value, spec: str = ".2f", suffix: str = "") -> str:
    """A table cell: the value formatted, or a dash where there is none."""
    return "–" if value is None else f"{value:{spec}}{suffix}"


def table_width(out, table) -> int:
    """Columns a table needs with no cell cut short."""
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update(width=10_000), table).maximum


@contextmanager
def doing(what: str, kept: str = "nothing was written") -> Iterator[None]:
    """Name the slow part a command is in, so Ctrl-C (or SIGTERM) is reported as "interrupted while ..."."""
    _activity.append(f"while {what}; {kept}")
    try:
        yield
    except KeyboardInterrupt:
        if not _interrupted_during:
            _interrupted_during.append(_activity[-1])
        raise
    finally:
        _activity.pop()


def interruption_message(signal_name: str = "") -> str:
    prefix = f"{signal_name}: " if signal_name else ""
    during = _interrupted_during or _activity
    return f"{prefix}interrupted {during[-1]}" if during else f"{prefix}interrupted"


def flag_message(exc: "SpecdecError") -> str:
    """A library error as the command line says it: the setting's name spelled as its flag."""
    from ..errors import flag_of

    return exc.naming(flag_of(exc.setting)) if exc.setting else str(exc)


def apply_threads(threads: int) -> None:
    """--threads: pin torch's CPU threads, warning when there are more threads than cores to run them."""
    from ..machine import usable_cores
    from ..models import set_threads

    set_threads(threads)
    cores = usable_cores()
    if cores and threads > cores:
        err_console().print(f"[yellow]warning:[/yellow] --threads {threads} is more than the {cores} cores this "
                            "process may use; threads competing for cores are much slower")


def print_error(message: str) -> None:
    """One line on stderr: `specdec: error: ...`."""
    first = " ".join(str(message).strip().split("\n")[0].split())
    sys.stderr.write(f"specdec: error: {first}\n")
    sys.stderr.flush()
