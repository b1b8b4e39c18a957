"""benchmarks/bench_verify_cost.py: its attention table leaves torch's threads as it found them, so the model's
parts timed after it (the kernels take torch's threads when the model loads) run on every core, not on one."""

from __future__ import annotations

import pytest
import torch
from helpers import benchmark_script

from specdec_cli import kernels


@pytest.mark.skipif(not kernels.available(), reason="the kernels are not compiled")
def test_the_attention_table_gives_torch_its_threads_back(capsys):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        benchmark_script("bench_verify_cost").attention_alone([8], [1, 2], 1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert "attention of one layer" in capsys.readouterr().out
