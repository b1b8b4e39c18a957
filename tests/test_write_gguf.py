"""benchmarks/write_gguf.py: llama.cpp's Q4_K_M recipe per tensor, the random blocks' scale, and its refusals."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "write_gguf.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("write_gguf", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["write_gguf"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("write_gguf", None)


def test_more_bits_layers_follow_llama_cpp(script):
    assert [layer for layer in range(16) if script.more_bits(layer, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [layer for layer in range(18) if script.more_bits(layer, 18)] == [0, 1, 4, 7, 10, 13, 15, 16, 17]


def test_recipe_types(script):
    assert script.recipe_type("blk.3.attn_q.weight", 2048, 3, 16) == Q.Q4_K
    assert script.recipe_type("blk.4.attn_v.weight", 2048, 4, 16) == Q.Q6_K
    assert script.recipe_type("blk.5.ffn_down.weight", 8192, 5, 16) == Q.Q4_K
    assert script.recipe_type("blk.0.ffn_down.weight", 8192, 0, 16) == Q.Q6_K
    assert script.recipe_type("token_embd.weight", 2048, None, 16) == Q.Q6_K  # tied: the output matrix
    assert script.recipe_type("blk.2.attn_q.weight", 640, 2, 18) == Q.Q5_0  # rows of 640: legacy fallbacks
    assert script.recipe_type("blk.0.attn_v.weight", 640, 0, 18) == Q.Q8_0
    assert script.recipe_type("token_embd.weight", 640, None, 18) == Q.Q8_0
    assert script.recipe_type("blk.0.attn_output.weight", 1024, 0, 18) == Q.Q4_K
    assert script.recipe_type("blk.0.attn_norm.weight", 640, 0, 18) == Q.F32


@pytest.mark.parametrize("kind", ["q4_k", "q6_k"])
def test_random_k_quant_blocks_have_the_asked_scale(script, kind):
    rng = np.random.default_rng(0)
    blocks = getattr(script, f"{kind}_blocks")(rng, 64, 512, 0.02)
    weights = dequantize(blocks, Q.Q4_K if kind == "q4_k" else Q.Q6_K)
    assert weights.shape == (64, 512) and np.isfinite(weights).all()
    assert abs(float(weights.mean())) < 0.002 and 0.016 < float(weights.std()) < 0.024


def test_a_file_not_written_here_is_kept(script, tmp_path):
    other = tmp_path / "model.gguf"
    other.write_bytes(b"not ours")
    with pytest.raises(SystemExit, match="--force"):
        script.refuse_overwrite(other, force=False)
    script.refuse_overwrite(other, force=True)  # --force: no objection
    script.refuse_overwrite(tmp_path / "new.gguf", force=False)  # nothing there yet
