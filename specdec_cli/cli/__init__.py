"""The `specdec` command line: a Typer app whose commands live one per module in this package.

Commands stay thin (parse flags, build a config, call one library function, render). This package is the
only place that imports Typer and Rich. `main()` turns user errors into one line and a non-zero exit;
SPECDEC_DEBUG=1 shows tracebacks.
"""

from __future__ import annotations

import os
import sys

import typer

from ..errors import SpecdecError
from .common import flag_message, interruption_message, print_error

app = typer.Typer(
    name="specdec",
    help="Lossless speculative decoding: a cheap drafter guesses, the target model verifies in one pass.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"specdec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", callback=_print_version, is_eager=True,
                                 help="Print specdec's version and exit."),
) -> None:
    """Lossless speculative decoding: a cheap drafter guesses, the target model verifies in one pass."""


# Each module registers its command(s) on `app` when imported.
from . import bench_cmd, chat_cmd, distill_cmd, index_cmd, memory_cmd, serve_cmd  # noqa: E402,F401


def _debug() -> bool:
    return os.environ.get("SPECDEC_DEBUG", "") not in ("", "0")


def _is_click(exc: BaseException, *names: str) -> bool:
    """Typer may bundle its own copy of Click, so Click's exceptions are recognised by name, not class."""
    return any(cls.__name__ in names for cls in type(exc).__mro__)


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: whatever was being written is cleaned up on the way out."""


_received: list[str] = []  # the signals that interrupted this run (Typer turns them into a plain exit code)


def _interrupt(signum: int, frame: object) -> None:
    import signal

    _received.append(signal.Signals(signum).name)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _interrupted() -> int:
    """Say what was interrupted; the exit status of a run ended by a signal (130 for Ctrl-C, 143 for SIGTERM)."""
    terminated = "SIGTERM" in _received
    print_error(interruption_message("SIGTERM" if terminated else ""))
    return 143 if terminated else 130


def _freeze_at_exit() -> None:
    """At the process's exit (atexit), leave the objects still alive out of the interpreter's last cycle
    collections. torch and transformers leave some 300,000 of them, which each of those collections walked:
    a second or two after the last line was printed ("Index written", then the process ran on; measured in
    docs/measurements.md). Finalization goes on as before (atexit handlers, modules cleared, streams
    flushed); only cycles among these objects are left to the process's end, as Python allows."""
    import gc

    gc.freeze()


def main() -> None:
    import atexit
    import signal
    import warnings

    atexit.unregister(_freeze_at_exit)  # once a process, however often main() runs in it (the tests run it in theirs)
    atexit.register(_freeze_at_exit)  # early: it runs after the handlers the command's imports register

    def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
        sys.stderr.write(f"specdec: warning: {message}\n")  # one line, not Python's file:line form

    warnings.showwarning = show_warning
    # transformers >= 5.24 renames forward's `past_key_values` to `cache` (removed in 5.40, above the range
    # pyproject.toml allows): a note for developers that a user can do nothing about
    warnings.filterwarnings("ignore", message=r".*`past_key_values` is deprecated", category=FutureWarning)
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when started with SIGINT ignored
        signal.signal(signal.SIGINT, _interrupt)
    try:
        code = app(prog_name="specdec", standalone_mode=False)
        if _received and code in (130, 143):
            code = _interrupted()
    except KeyboardInterrupt:
        _received.append("SIGINT") if not _received else None
        code = _interrupted()
    except SpecdecError as exc:
        if _debug():
            raise
        print_error(flag_message(exc))
        code = 1
    except Exception as exc:
        interrupt = exc.__cause__ or exc.__context__
        if _is_click(exc, "Exit", "Abort") and isinstance(interrupt, KeyboardInterrupt):  # Typer's wrapping of Ctrl-C
            code = _interrupted()
        elif _is_click(exc, "Exit"):
            code = getattr(exc, "exit_code", 0)
        elif _is_click(exc, "Abort"):
            print_error("aborted")
            code = 130
        elif _is_click(exc, "ClickException"):  # usage errors: bad flag, bad value
            if _debug():
                raise
            format_message = getattr(exc, "format_message", None)
            print_error(format_message() if callable(format_message) else str(exc))
            code = getattr(exc, "exit_code", 2)
        else:  # a bug: one line unless debugging
            if _debug():
                raise
            print_error(f"internal error: {type(exc).__name__}: {exc} (SPECDEC_DEBUG=1 shows the traceback)")
            code = 1
    sys.exit(code if isinstance(code, int) else 0)
