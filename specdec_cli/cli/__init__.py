"""The `specdec` command line: a Typer app whose commands live one per module in this package.

Commands stay thin (parse flags, build a config, call one library function, render). This package is the
only place that imports Typer and Rich. `main()` turns user errors into one line and a non-zero exit;
SPECDEC_DEBUG=1 shows tracebacks.
"""

from __future__ import annotations

import os
import sys

import typer

app = typer.Typer(
    name="specdec",
    help="Lossless speculative decoding: a cheap drafter guesses, the target model verifies in one pass.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)



@app.callback()
def _root() -> None:
    """Lossless speculative decoding: a cheap drafter guesses, the target model verifies in one pass."""


# Each module registers its command(s) on `app` when imported.
from . import bench_cmd, chat_cmd, distill_cmd, index_cmd  # noqa: E402,F401


def _debug() -> bool:
    return os.environ.get("SPECDEC_DEBUG", "") not in ("", "0")


def _is_click(exc: BaseException, *names: str) -> bool:
    """Typer may bundle its own copy of Click, so Click's exceptions are recognised by name, not class."""
    return any(cls.__name__ in names for cls in type(exc).__mro__)


def main() -> None:
    from ..errors import SpecdecError
    from .common import flag_message, print_error

    try:
        code = app(prog_name="specdec", standalone_mode=False)
    except KeyboardInterrupt:
        print_error("interrupted")
        code = 130
    except SpecdecError as exc:
        if _debug():
            raise
        print_error(flag_message(exc))
        code = 1
    except Exception as exc:
        if _is_click(exc, "Exit"):
            code = getattr(exc, "exit_code", 0)
        elif _is_click(exc, "Abort"):
            print_error("aborted")
            code = 130
        elif _is_click(exc, "ClickException"):  # usage errors: bad flag, bad value
            if _debug():
                raise
            print_error(exc.format_message())
            code = getattr(exc, "exit_code", 2)
        else:  # a bug: one line unless debugging
            if _debug():
                raise
            print_error(f"internal error: {type(exc).__name__}: {exc} (SPECDEC_DEBUG=1 shows the traceback)")
            code = 1
    sys.exit(code if isinstance(code, int) else 0)
