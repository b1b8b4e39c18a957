"""Capture the chat's live view on the default model as an SVG (docs/chat.svg) with Rich's export.

It runs a real generation through the same renderer `specdec chat` uses and snapshots the screen at the
last step that rejected draft tokens, so the picture shows all three styles: accepted drafts (green),
the target's own tokens (bold) and rejected drafts (struck through). Run: .venv/bin/python docs/capture_chat.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from rich.console import Console, Group
from rich.text import Text

from specdec_cli.cli.render import STYLES, TranscriptView, text_decoder
from specdec_cli.session.chat import ChatSession, ChatSettings
from specdec_cli.session.run_settings import run_settings
from specdec_cli.target_model.load.models import load_target

PROMPT = ("Fix the spelling in this paragraph and return it: 'Speculative decodng lets a small drafter gues "
          "several tokens ahead. The big model then cheks all of them in one pass, and keeps the ones it "
          "would have writen itself.'")


def main(out: str = "docs/chat.svg") -> None:
    target = load_target()
    session = ChatSession(target.model, target.tokenizer, ChatSettings(run_settings("sam", max_new_tokens=160)))
    view = TranscriptView(text_decoder(target.tokenizer), "sam")
    best: dict = {}

    def on_event(event) -> None:
        view.add(event)
        if view.rejected:
            best.update(snapshot=copy.deepcopy((view.committed, view.rejected)), status=view.status().line())

    session.ask(PROMPT, on_event=on_event)
    committed, rejected = best.get("snapshot", (view.committed, []))
    best.setdefault("status", view.status().line())
    answer = Text()
    for span in committed + rejected:
        answer.append(span.text, STYLES[span.kind])
    console = Console(record=True, width=100, force_terminal=True, color_system="truecolor")
    console.print(Text(">>> ", style="bold") + Text(PROMPT))
    console.print(Group(answer, Text(best["status"], style="dim")))
    Path(out).write_text(console.export_svg(title="specdec chat --drafter sam"))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
