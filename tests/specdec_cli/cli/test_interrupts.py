"""Interruptions: Ctrl-C (SIGINT) and SIGTERM on real `specdec` processes. Every one ends with one line saying
what was interrupted and what was kept, exit 130 (SIGINT) or 143 (SIGTERM), and no temporary file left behind;
a temporary left by a killed process is removed by the next write.

A signal is sent once the process shows it is in the part to interrupt (the answer streaming, the tokenising
progress drawn), never after a guessed delay; the time limits are hang guards only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_GUARD, cli_env

from specdec_cli.files import TEMP_MARK, atomic_directory, atomic_file, clean_stale_temporaries


def _start(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specdec_cli", *args], cwd=cwd, env=cli_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _finish(process: subprocess.Popen, limit: float = HANG_GUARD) -> tuple[int, str]:
    try:
        _, stderr = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running {limit} s after the signal")
    return process.returncode, stderr


@pytest.mark.parametrize("sent, code, prefix", [(signal.SIGINT, 130, ""), (signal.SIGTERM, 143, "SIGTERM: ")])
def test_chat_interrupted_while_answering(endless_model_dir, tmp_path, sent, code, prefix):
    process = _start("chat", "--target", endless_model_dir, "--prompt", "tell me a story", "-n", "100000",
                     "--plain", "--drafter", "none", cwd=tmp_path)
    import select

    ready, _, _ = select.select([process.stdout], [], [], HANG_GUARD)  # the answer has started streaming
    assert ready, f"no output within {HANG_GUARD} s"
    process.send_signal(sent)  # while answering: the answer runs to the model's 2,048-token context
    returncode, stderr = _finish(process)
    assert returncode == code, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("specdec: error:")]
    assert lines == [f"specdec: error: {prefix}interrupted while answering; the answer so far is printed above"]
    assert "Traceback" not in stderr


def test_build_index_stops_while_tokenising_and_leaves_no_file(tmp_path):
    """One 24 MB document, interrupted once its tokenising has begun. That the interruption is seen within one
    piece of the document, not at its end, is test_build_index_cli.py's test_a_long_document_is_tokenised_in_pieces
    (no call into the tokenizer sees the whole document). A short document comes first: the progress counts the
    tokens of whole documents only, so without it the count would stay 0 until the long one was done."""
    pexpect = pytest.importorskip("pexpect")
    from helpers import make_char_tokenizer_dir

    tokenizer = make_char_tokenizer_dir(tmp_path / "tok")
    (tmp_path / "first.txt").write_text("a short first document\n")
    (tmp_path / "big.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 550_000)
    # in a terminal, so that the progress display is drawn: it tells when the first tokens are done
    command = ["-m", "specdec_cli", "build-index", "first.txt", "big.txt", "-o", "big.sam", "--target", str(tokenizer)]
    child = pexpect.spawn(sys.executable, command, cwd=str(tmp_path), env=cli_env({"TERM": "xterm"}), encoding="utf-8",
                          timeout=HANG_GUARD, dimensions=(40, 200))
    child.expect(r"Tokenising\s+[1-9][\d,]* tokens")
    child.kill(signal.SIGINT)
    child.expect("specdec: error: interrupted while building the index; no index was written to big.sam")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, (child.exitstatus, child.signalstatus)
    assert not (tmp_path / "big.sam").exists()
    assert not [path for path in tmp_path.iterdir() if TEMP_MARK in path.name]


def test_an_interrupted_write_leaves_nothing_and_a_dead_writers_temporaries_are_cleaned(tmp_path):
    with pytest.raises(KeyboardInterrupt), atomic_file(tmp_path / "report.json") as temporary:
        temporary.write_text("half")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt), atomic_directory(tmp_path / "model") as folder:
        (folder / "weights").write_text("half")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".index.sam{TEMP_MARK}{int(dead.stdout)}-abcd1234"
    stale.write_bytes(b"\0" * 1024)
    mine = tmp_path / f".other{TEMP_MARK}{os.getpid()}-00000000"  # a live writer's: kept
    mine.write_bytes(b"x")
    assert clean_stale_temporaries(tmp_path) == [stale]
    assert mine.exists() and not stale.exists()
