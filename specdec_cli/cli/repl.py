"""The interactive `specdec chat`: a read-answer loop with slash commands and the live speculation view.

The conversation, the engine and the drafter live in a `ChatSession` (specdec_cli.session.chat); this module only
reads lines, dispatches commands, renders answers and prints tables. Ctrl-C while generating stops that
answer and keeps what was written; Ctrl-C or Ctrl-D at the prompt leaves.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Optional

from ..decoding.stats import GenerationStats, merge
from ..drafters import DRAFTERS
from ..errors import SpecdecError
from ..files import check_output_file, read_json, write_json_atomic
from .output import PrintedAnswer, turn_json
from .render import LiveTranscript, TranscriptView, text_decoder

HELP = """\
/help                 this list
/exit, /quit, Ctrl-D  leave
/clear                start a new conversation (history and drafter state are dropped)
/system TEXT          set the system message (and start a new conversation)
/set KEY VALUE        temperature, top_p, top_k, min_p, seed, max_new_tokens, draft_max, repeat_penalty,
                      repeat_last_n, presence_penalty, frequency_penalty
/drafter NAME         switch drafter: {drafters}
/stats                per-turn speed and acceptance, per-position acceptance chart
/save [--force] FILE  the conversation and its statistics as JSON
\"\"\"                   start or end multi-line input
Ctrl-C                stop the answer being written (it is kept)"""

SETTABLE = {  # /set's keys (llama.cpp's names) -> how a value is read, the GenerationConfig field it sets
    "temperature": (float, "temperature"),
    "top_p": (float, "top_p"),
    "top_k": (int, "top_k"),
    "min_p": (float, "min_p"),
    "seed": (int, "seed"),
    "max_new_tokens": (int, "max_new_tokens"),
    "draft_max": (int, "draft_max"),
    "repeat_penalty": (float, "repetition_penalty"),
    "repeat_last_n": (int, "penalty_last_n"),
    "presence_penalty": (float, "presence_penalty"),
    "frequency_penalty": (float, "frequency_penalty"),
}


SAVE_FORMAT = "specdec-conversation"  # what /save writes, and what it may replace without --force


def _is_text(text: str) -> bool:
    """Whether a line read is text: stdin that is not UTF-8 arrives with lone surrogates in it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Repl:
    def __init__(self, session, console, err, plain: bool, show_rejected: bool, settings_lines: list[str]):
        self.session = session
        self.console = console  # answers
        self.err = err  # messages, status, tables
        self.plain = plain
        self.show_rejected = show_rejected
        self.settings_lines = settings_lines

    # -- input ---------------------------------------------------------------------------------------------

    def read(self) -> Optional[str]:
        """One user message (multi-line between triple quotes); None at end of input."""
        first = input(">>> ")
        if first.strip() != '"""':
            return first
        lines: list[str] = []
        while True:
            line = input("... ")
            if line.strip() == '"""':
                return "\n".join(lines)
            lines.append(line)

    def run(self) -> int:
        import signal

        # Ctrl-C must reach us even when a parent started us with SIGINT ignored (background jobs, CI).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            import readline  # noqa: F401  (line editing and history where available)
        except ImportError:
            pass
        for line in self.settings_lines:
            self.err.print(line)
        try:  # the system message and a user turn's opening, computed before the first line is read
            self.session.warm_up()
        except SpecdecError:
            pass  # (a template that cannot write a first turn: the first prompt says why)
        self.err.print("[dim]Type /help for commands, /exit to leave.[/dim]")
        while True:
            try:
                text = self.read()
            except EOFError:
                self.err.print()
                return 0
            except KeyboardInterrupt:
                self.err.print()
                return 0
            except UnicodeDecodeError:
                text = "\udcff"  # a strict stdin's way of saying the same as a lone surrogate: not text
            if text is None:
                return 0
            if not text.strip():
                continue
            if not _is_text(text):  # bytes that are not UTF-8 (a binary file piped in): said, and skipped
                self.err.print("[red]that input is not UTF-8 text; it was not sent[/red]", highlight=False)
                continue
            if text.startswith("/") and not text.startswith("//"):
                if self.command(text.strip()) == "exit":
                    return 0
                continue
            self.answer(text[1:] if text.startswith("//") else text)

    # -- commands ------------------------------------------------------------------------------------------

    def command(self, line: str) -> Optional[str]:
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            if name in ("/exit", "/quit"):
                return "exit"
            if name == "/help":
                self.err.print(HELP.format(drafters=", ".join(DRAFTERS)), markup=False)
            elif name == "/clear":
                self.session.clear()
                self.err.print("[dim]New conversation.[/dim]")
            elif name == "/system":
                self.session.set_system(arg or None)
                self.session.clear()
                self.err.print(f"[dim]System message {'set' if arg else 'cleared'}; new conversation.[/dim]")
            elif name == "/set":
                self.set(arg)
            elif name == "/drafter":
                if not arg:
                    raise SpecdecError(f"usage: /drafter NAME ({', '.join(DRAFTERS)})")
                self.session.set_drafter(arg)
                self.err.print(f"[dim]Drafter: {arg}.[/dim]")
            elif name == "/stats":
                self.stats()
            elif name == "/save":
                force = arg.startswith("--force ")
                arg = arg[len("--force "):].strip() if force else arg
                if not arg:
                    raise SpecdecError("usage: /save [--force] FILE")
                self.save(arg, force)
            else:
                raise SpecdecError(f"unknown command {name}; /help lists the commands")
        except SpecdecError as exc:
            self.err.print(f"[red]{exc}[/red]", markup=True, highlight=False)
        return None

    def set(self, arg: str) -> None:
        key, _, value = arg.partition(" ")
        key = key.replace("-", "_")
        if key not in SETTABLE or not value.strip():
            raise SpecdecError(f"usage: /set KEY VALUE with KEY one of {', '.join(SETTABLE)}")
        parse, field = SETTABLE[key]
        try:
            parsed = parse(value.strip())
        except ValueError:
            raise SpecdecError(f"/set {key}: {value.strip()!r} is not a valid {parse.__name__}") from None
        updated = replace(self.session.generation, **{field: parsed})  # draft_max: the budget and the drafter's cap
        try:
            updated.check()  # a one-line reason; the old settings stay
        except SpecdecError as error:
            raise SpecdecError(error.naming(key) if error.setting == field else str(error)) from None
        self.session.set_generation(updated)
        self.err.print(f"[dim]{key} = {parsed}[/dim]")

    # -- answering -----------------------------------------------------------------------------------------

    def answer(self, text: str) -> None:
        view = TranscriptView(text_decoder(self.session.tokenizer), self.session.drafter_name, self.show_rejected)
        try:
            if self.plain:
                stream = PrintedAnswer(self.session.tokenizer, self.session.generation.stop)
                def show(event: Any) -> None:
                    view.add(event)
                    stream.on_event(event)

                turn = self.session.ask(text, on_event=show)
                stream.finish(turn.answer)
            else:
                with LiveTranscript(self.console, view) as live:
                    turn = self.session.ask(text, on_event=live.on_event)
        except KeyboardInterrupt:
            partial = self.session.tokenizer.decode(view.tokens, skip_special_tokens=True)
            self.session.record(text, partial, len(view.tokens))
            if self.plain:
                sys.stdout.write("\n")
            self.err.print(f"[yellow]Interrupted; kept {len(view.tokens)} tokens of the answer.[/yellow]")
            return
        except SpecdecError as exc:  # a prompt the model cannot take: say so, and the conversation goes on
            self.err.print(f"[red]{exc}[/red]", highlight=False)
            return
        self.err.print(f"[dim]{view.status().line()}[/dim]")
        try:  # while the user writes: the next turn's opening (the template's), computed now
            self.session.compute_ahead(self.session.history, turn.prompt_tokens)
        except SpecdecError:
            pass  # (a template that cannot write the next turn: nothing computed, the next prompt says why)

    # -- statistics ----------------------------------------------------------------------------------------

    def stats(self) -> None:
        from rich.table import Table

        turns = self.session.turns
        cut = getattr(self.session, "cut_short", [])
        kept = (f"{len(cut)} answer{'s' if len(cut) != 1 else ''} cut short (Ctrl-C) kept {sum(cut):,} tokens, "
                "without statistics") if cut else ""
        if not turns:
            self.err.print(f"[dim]No finished answers yet; {kept}.[/dim]" if kept else "[dim]No answers yet.[/dim]")
            return
        table = Table(title="This conversation", title_justify="left")
        for column in ("turn", "drafter", "tokens", "tok/s", "tokens/step", "acceptance", "TTFT s"):
            table.add_column(column, justify="right" if column not in ("drafter",) else "left")
        for number, turn in enumerate(turns, 1):
            stats = turn.generation.stats or GenerationStats()
            table.add_row(str(number), turn.drafter, str(stats.new_tokens), f"{stats.tokens_per_second:.1f}",
                          f"{stats.mean_accepted_tokens:.2f}", f"{stats.acceptance_rate:.0%}",
                          f"{stats.ttft_seconds:.2f}")
        pooled = merge(turn.generation.stats for turn in turns if turn.generation.stats) or GenerationStats()
        table.add_row("all", "", str(pooled.new_tokens), f"{pooled.tokens_per_second:.1f}",
                      f"{pooled.mean_accepted_tokens:.2f}", f"{pooled.acceptance_rate:.0%}",
                      f"{pooled.ttft_seconds:.2f}", style="bold")
        self.err.print(table)
        if kept:
            self.err.print(f"[dim]Besides these, {kept}.[/dim]")
        if pooled.position_drafted:
            self.err.print("Per-position acceptance (share of steps whose i-th draft token was accepted):")
            for position, (drafted, accepted) in enumerate(zip(pooled.position_drafted, pooled.position_accepted), 1):
                share = accepted / drafted if drafted else 0.0
                bar = "█" * round(share * 40)
                self.err.print(f"  {position:>2} {bar:<40} {share:5.0%}  ({accepted}/{drafted})", markup=False)

    def save(self, path: str, force: bool = False) -> None:
        """The conversation as JSON; an existing file is replaced only when it is a saved conversation, or with
        `/save --force FILE`."""
        import os

        final = check_output_file(path, "/save", flag=False, own_rule=True)
        if not force and os.path.lexists(final) and read_json(final).get("format") != SAVE_FORMAT:
            raise SpecdecError(f"/save {path}: the file exists and is not a saved specdec conversation; choose "
                               "another name, or /save --force FILE to replace it")
        document = {
            "format": SAVE_FORMAT,
            "system": self.session.system,
            "drafter": self.session.drafter_name,
            "messages": self.session.history,
            "turns": [dict(turn_json(turn), user=turn.user) for turn in self.session.turns],
        }
        write_json_atomic(path, document)
        self.err.print(f"[dim]Saved {len(self.session.history)} messages to {path}.[/dim]")
