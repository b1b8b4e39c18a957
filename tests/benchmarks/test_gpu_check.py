"""benchmarks/gpu_check.sh --dry-run: the GPU check's whole path on the CPU (tiny shapes, short answers).

It writes a tokenizer-only GGUF from the default model, a random-weight `tiny` GGUF from it, runs the bench on the
device engine with every drafter that needs no file and an oracle row, and writes one JSON and one log. On a GPU
the same script (without --dry-run) measures the issue's goals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"


def test_the_gpu_check_dry_run_passes_on_the_cpu(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env.pop("SPECDEC_HOME", None)
    result = subprocess.run([str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads((tmp_path / "gpu_check.json").read_text())
    assert document["dry_run"] and document["goals"] == {"every_drafter_identical": True}
    packed = document["packed_gemm"]["results"]  # bench_packed.py's path (Triton's interpreter: not its speed)
    assert [row["matrix"] for row in packed] == ["tiny_q4_k", "tiny_q6_k"]
    assert all(tile["max_relative_difference"] < 1e-5 for row in packed for tile in row["tiles"].values())
    tiny = document["models"]["tiny"]
    assert set(tiny["methods"]) == {"none", "pld", "sam", "recycle", "aded", "sam+aded", "sam+recycle", "oracle-8"}
    assert all(left == right for left, right in (method["identical"].split("/") for method in tiny["methods"].values()))
    assert tiny["exact_check"].startswith("on: specdec's device engine on cpu")
    log = (tmp_path / "gpu_check.log").read_text()
    assert "write_gguf.py --tokenizer-only" in log and "--decoder device" in log


def _gpu_check():
    """benchmarks/gpu_check.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT.with_suffix(".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refused(gpu_check, monkeypatch, capsys, args, needle):
    """main(args) ends in one line holding `needle`, before any command runs or anything is written."""
    import pytest

    monkeypatch.setattr(gpu_check.Log, "run", lambda *a, **k: pytest.fail("a command ran before the check"))
    with pytest.raises(SystemExit) as ended:
        gpu_check.main(args)
    message = str(ended.value.code)
    assert needle in message and "\n" not in message, message
    assert capsys.readouterr().out == ""


def test_cuda_without_a_gpu_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """It wrote the 8B-shaped model (4.47 GB) before the first bench failed."""
    import torch

    gpu_check = _gpu_check()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    _refused(gpu_check, monkeypatch, capsys, ["--out", str(out)], "--device cuda, but torch")
    _refused(gpu_check, monkeypatch, capsys, ["--out", str(out), "--device", "tpu"], "--device tpu: give cuda or cpu")
    assert not out.exists()


def test_an_out_that_is_a_file_or_a_users_folder_is_refused_and_left_alone(tmp_path, monkeypatch, capsys):
    """A file ended in a traceback (FileExistsError); a folder of the user's own was written into."""
    gpu_check = _gpu_check()
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    _refused(gpu_check, monkeypatch, capsys, ["--dry-run", "--out", str(notes)], "exists and is not a folder")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    _refused(gpu_check, monkeypatch, capsys, ["--dry-run", "--out", str(mine)], "a folder gpu_check did not write")
    own = tmp_path / "own"
    own.mkdir()
    (own / gpu_check.OWN_FILE).write_text("")
    os.mkfifo(own / "tiny.gguf")
    _refused(gpu_check, monkeypatch, capsys, ["--dry-run", "--out", str(own)], "tiny.gguf is not a regular file")
    assert notes.read_text() == "mine\n" and sorted(entry.name for entry in mine.iterdir()) == ["notes.txt"]


def test_every_drafter_identical_is_null_when_nothing_was_compared():
    """A bench that failed, or compared no output, said `false` as if outputs had differed."""
    gpu_check = _gpu_check()
    run = gpu_check.DRY[0]

    def report(identical, compared):
        return {"results": [{"method": "none", "category": "overall", "identical": 0, "compared": 0},
                            {"method": "pld", "category": "overall", "identical": identical, "compared": compared}]}

    assert gpu_check.summary(run, report(2, 2), 1.0)["every_drafter_identical"] is True
    assert gpu_check.summary(run, report(1, 2), 1.0)["every_drafter_identical"] is False
    assert gpu_check.summary(run, report(0, 0), 1.0)["every_drafter_identical"] is None
    assert gpu_check.every_identical([]) is None and gpu_check.every_identical([True, None]) is None
    assert gpu_check.every_identical([None, False]) is False and gpu_check.every_identical([True, True]) is True
