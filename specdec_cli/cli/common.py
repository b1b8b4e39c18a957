"""Shared pieces of the CLI layer: lazily created Rich consoles and the one-line error printer."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING

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


def flag_message(exc: "SpecdecError") -> str:
    """A library error as the command line says it: the setting's name spelled as its flag."""
    from ..errors import flag_of

    return exc.naming(flag_of(exc.setting)) if exc.setting else str(exc)


def print_error(message: str) -> None:
    """One line on stderr: `specdec: error: ...`."""
    first = " ".join(str(message).strip().split("\n")[0].split())
    sys.stderr.write(f"specdec: error: {first}\n")
    sys.stderr.flush()
