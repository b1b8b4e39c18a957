"""benchmarks/bench_infill.py: the completions it cuts from source files (as llama.vim sends them), and its whole
path on a tiny model with fill-in-the-middle tokens (the numbers are not checked, only that every drafted answer
was plain decoding's, text and tokens)."""

from __future__ import annotations

import argparse
from pathlib import Path

from conftest import make_fim_model_dir
from helpers import benchmark_script


def _source(folder: Path) -> Path:
    folder.mkdir()
    body = [f"def function_{index}(value):\n    total = value + {index}\n    return total\n" for index in range(120)]
    (folder / "module.py").write_text("\n".join(body))
    (folder / "short.py").write_text("x = 1\n")  # too short to cut from
    return folder


def test_the_cases_are_cut_as_an_editor_sends_them(tmp_path):
    module = benchmark_script("bench_infill")
    cases = module.make_cases(_source(tmp_path / "src"), 6, seed=3)
    assert cases == module.make_cases(tmp_path / "src", 6, seed=3)  # the same cases for the same seed
    for case in cases:
        line_start = case["input_prefix"].rsplit("\n", 1)[1]
        assert line_start.startswith(" " * case["n_indent"]) and case["n_indent"] == 4
        assert case["input_prefix"].count("\n") == module.BEFORE and case["input_suffix"].count("\n") == module.AFTER
        assert case["n_predict"] == 64 and case["temperature"] == 0


def test_the_benchmark_runs_on_a_model_with_fim_tokens(tmp_path):
    module = benchmark_script("bench_infill")
    target = make_fim_model_dir(tmp_path / "fim")
    args = argparse.Namespace(target=target, drafter="sam", threads=1, cases=2, rounds=1, seed=1,
                              source=str(_source(tmp_path / "src")), json_out=None, llama_server="none",
                              llama_spec_type=None)
    result = module.run(args)
    assert result["answers"] == 2 and result["identical"] == 2 and result["cases"] == 2
