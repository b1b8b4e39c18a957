"""The real REPL in a pseudo-terminal on a tiny model: what a person types, what a person sees.

Every wait is for something the REPL prints, never for a time: the prompt `>>> ` is drawn by readline once it
has the terminal, so a key sent after it is read as typed. The timeout is a hang guard only."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import HANG_GUARD, cli_env

pexpect = pytest.importorskip("pexpect")


def _spawn(model_dir, *extra):
    env = cli_env({"TERM": "xterm", "COLUMNS": "100", "LINES": "40"})  # dtype and weights pinned: nothing timed
    env.pop("NO_COLOR", None)
    return pexpect.spawn(sys.executable, ["-m", "specdec_cli", "chat", "--target", model_dir, "-n", "24", *extra],
                         env=env, encoding="utf-8", timeout=HANG_GUARD, dimensions=(40, 100))


def test_repl_session(endless_model_dir, tmp_path):
    child = _spawn(endless_model_dir)
    child.expect("drafter sam")
    child.expect(">>> ")
    child.sendline("hello there")
    child.expect("tokens/step")  # the status line after the answer
    child.expect(">>> ")
    child.sendline('"""')
    child.sendline("first line")
    child.sendline("second line")
    child.sendline('"""')
    child.expect("tokens/step")
    child.expect(">>> ")
    child.sendline("/set temperature 0.7")
    child.expect("temperature = 0.7")
    child.sendline("/set top_p 7")
    child.expect(r"(--top-p|top_p) must be in \(0, 1\]")  # named as the /set key, not as a command-line flag
    assert child.match.group(1) == "top_p"
    child.sendline("/frobnicate")
    child.expect("unknown command /frobnicate")
    child.sendline("/stats")
    child.expect("Per-position acceptance")
    save = tmp_path / "conversation.json"
    child.sendline(f"/save {save}")
    child.expect("Saved 4 messages")
    child.sendline("/clear")
    child.expect("New conversation")
    child.sendline("/drafter none")
    child.expect("Drafter: none")
    # a long answer, interrupted with Ctrl-C: the REPL stays and keeps the partial answer
    child.sendline("/set max_new_tokens 1900")
    child.expect("max_new_tokens = 1900")
    child.sendline("tell me a long story")
    child.expect("tokens/s")  # the live status line is drawing: the answer (1900 tokens) is under way
    child.sendintr()
    child.expect("Interrupted; kept")
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    document = json.loads(save.read_text())
    assert [m["role"] for m in document["messages"]] == ["user", "assistant", "user", "assistant"]
    assert document["messages"][2]["content"] == "first line\nsecond line"
    assert len(document["turns"]) == 2 and "mean_accepted_tokens" in document["turns"][0]["stats"]


def test_ctrl_c_and_ctrl_d_at_prompt_exit_cleanly(tiny_model_dir):
    for key in ("intr", "eof"):
        child = _spawn(tiny_model_dir)
        child.expect(">>> ")  # readline has the terminal
        child.sendintr() if key == "intr" else child.sendeof()
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0, key
        assert "Traceback" not in (child.before or "")


def test_a_pasted_line_longer_than_the_terminal_buffer_arrives_whole(tiny_model_dir, tmp_path):
    """A terminal in line mode holds 4,095 bytes a line; a 20,000-character paste must arrive whole (the tiny
    model's 2,048-token context then refuses it, naming its length, and the chat goes on), and Ctrl-D must
    still end the session."""
    child = _spawn(tiny_model_dir, "-n", "4")
    child.expect(">>> ")  # readline has the terminal
    long_line = ("abcdefghij" * 2000)[:20000]
    for start in range(0, len(long_line), 1000):  # as a paste arrives: in chunks
        child.send(long_line[start : start + 1000])
    child.send("\r")
    child.expect(r"the prompt has (\d+) tokens, but this model reads at most 2048")
    assert int(child.match.group(1)) >= 20000  # every character arrived (plus the chat template's tokens)
    child.expect(">>> ")
    child.sendline("hello")
    child.expect("tokens/step")
    child.expect(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_no_color_means_no_styling_at_all(tiny_model_dir):
    """NO_COLOR (no-color.org) in a terminal: the banner, the live answer, its status line and /stats carry no
    ANSI styling (Rich's no_color dropped colours but still sent bold and dim)."""
    import io
    import re

    env = cli_env({"TERM": "xterm", "COLUMNS": "100", "LINES": "40", "NO_COLOR": "1"})
    child = pexpect.spawn(sys.executable, ["-m", "specdec_cli", "chat", "--target", tiny_model_dir, "-n", "8"],
                          env=env, encoding="utf-8", timeout=HANG_GUARD, dimensions=(40, 100))
    child.logfile_read = seen = io.StringIO()
    child.expect("Type /help")
    child.expect(">>> ")
    child.sendline("hello there")
    child.expect("tokens/step")
    child.expect(">>> ")
    child.sendline("/stats")
    child.expect("Per-position acceptance")
    child.expect(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "specdec chat" in seen.getvalue()
    assert re.findall(r"\x1b\[[0-9;]*m", seen.getvalue()) == []  # select graphic rendition: colours, bold, dim
