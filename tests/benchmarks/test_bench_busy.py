"""benchmarks/bench_busy.py: drafters against plain decoding, alternated per prompt, beside CPU burners. Its whole
path on the default model (short answers, one round, no burner: the numbers are not checked, only that every
drafter's answers were plain decoding's and a row came out for each), and the report's arithmetic."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import benchmark_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_busy.py"


def test_the_report_is_each_drafters_decoding_speed_over_plain_decodings():
    args = argparse.Namespace(rounds=2, burners=1, bar=0.97)
    seconds = {("qa", "none", 0): 1.0, ("qa", "sam", 0): 0.5, ("qa", "none", 1): 2.0, ("qa", "sam", 1): 2.0,
               ("code", "none", 0): 1.0, ("code", "sam", 0): 1.0, ("code", "none", 1): 1.0, ("code", "sam", 1): 1.0}
    tokens = {key: 100 for key in seconds}
    steps = {("qa", "none"): [200, 0, 0], ("qa", "sam"): [100, 150, 100], ("code", "sam"): [100, 0, 0]}
    report = benchmark_script("bench_busy")._report(seconds, tokens, steps, ["none", "sam"], args)
    rows = {row["category"]: row for row in report["rows"]}
    assert rows["qa"]["speed_over_plain"] == pytest.approx((200 / 2.5) / (200 / 3))  # 80 against 66.7 tok/s
    assert rows["qa"]["fewest_of_rounds"] == pytest.approx(1.0)  # round 0: 2.0x, round 1: 1.0x
    assert rows["code"]["speed_over_plain"] == pytest.approx(1.0)
    assert rows["overall"]["speed_over_plain"] == pytest.approx((400 / 4.5) / (400 / 5))
    assert (rows["qa"]["tokens_per_step"], rows["qa"]["drafted_per_step"], rows["qa"]["acceptance"]) == (
        pytest.approx(2.0), pytest.approx(1.5), pytest.approx(2 / 3))  # 200 tokens in 100 steps, 100 of 150 drafts
    assert rows["code"]["tokens_per_step"] == pytest.approx(2.0) and rows["code"]["acceptance"] == 0.0
    assert rows["overall"]["tokens_per_step"] == pytest.approx(2.0)  # 400 tokens in 200 steps


def test_the_benchmark_runs_on_the_default_model(tmp_path):
    out = tmp_path / "busy.json"
    env = dict(os.environ, SPECDEC_HOME=str(tmp_path / "home"))
    result = subprocess.run([sys.executable, str(SCRIPT), "--categories", "code,qa", "--limit", "1", "-n", "12",
                             "--rounds", "1", "--burners", "0", "--drafters", "pld,sam", "--json-out", str(out)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [(row["category"], row["drafter"]) for row in report["rows"]] == [
        ("code", "pld"), ("code", "sam"), ("qa", "pld"), ("qa", "sam"), ("overall", "pld"), ("overall", "sam")]
    assert all(row["speed_over_plain"] > 0 and row["plain_tokens_per_second"] > 0 for row in report["rows"])
    assert all(row["tokens_per_step"] >= 1.0 for row in report["rows"])
    assert "overall" in result.stdout
