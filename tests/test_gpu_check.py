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

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


def test_the_gpu_check_dry_run_passes_on_the_cpu(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env.pop("SPECDEC_HOME", None)
    result = subprocess.run([str(SCRIPT), "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    document = json.loads((tmp_path / "gpu_check.json").read_text())
    assert document["dry_run"] and document["goals"] == {"every_drafter_identical": True}
    tiny = document["models"]["tiny"]
    assert set(tiny["methods"]) == {"none", "pld", "sam", "recycle", "aded", "sam+aded", "sam+recycle", "oracle-8"}
    assert all(left == right for left, right in (method["identical"].split("/") for method in tiny["methods"].values()))
    assert tiny["exact_check"].startswith("on: specdec's device engine on cpu")
    log = (tmp_path / "gpu_check.log").read_text()
    assert "write_gguf.py --tokenizer-only" in log and "--decoder device" in log
