"""Interruptions: Ctrl-C (SIGINT) and SIGTERM on real `specdec` processes, each bounded in time. Every one
ends with one line saying what was interrupted and what was kept, exit 130 (SIGINT) or 143 (SIGTERM), and
no temporary file left behind; a temporary left by a killed process is removed by the next write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec_cli.files import TEMP_MARK, atomic_directory, atomic_file, clean_stale_temporaries

REPO = Path(__file__).resolve().parent.parent


def _start(*args: str, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("SPECDEC_DEBUG", None)
    return subprocess.Popen([sys.executable, "-m", "specdec_cli", *args], cwd=cwd, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _finish(process: subprocess.Popen, limit: float = 30.0) -> tuple[int, str]:
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

    ready, _, _ = select.select([process.stdout], [], [], 120)  # the answer has started streaming
    assert ready, "no output within 120 s"
    time.sleep(0.5)
    process.send_signal(sent)
    returncode, stderr = _finish(process)
    assert returncode == code, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("specdec: error:")]
    assert lines == [f"specdec: error: {prefix}interrupted while answering; the answer so far is printed above"]
    assert "Traceback" not in stderr


def test_build_index_stops_promptly_while_tokenising_and_leaves_no_file(tmp_path):
    """One 24 MB document: tokenised in pieces, so SIGINT is seen within seconds (it used to take ~60 s)."""
    from test_sam_index import make_char_tokenizer_dir

    tokenizer = make_char_tokenizer_dir(tmp_path / "tok")
    (tmp_path / "big.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 550_000)
    process = _start("build-index", "big.txt", "-o", "big.sam", "--target", str(tokenizer), cwd=tmp_path)
    # start-up takes ~3 s and tokenising 24 M characters ~15 s on this project's machines: 6 s lands inside it
    time.sleep(6)
    assert process.poll() is None, process.stderr.read()
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    returncode, stderr = _finish(process)
    assert time.monotonic() - started < 10  # one call covers about 1 MB of text; it used to be the whole file
    assert returncode == 130, stderr
    assert "specdec: error: interrupted while building the index; no index was written to big.sam" in stderr
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
