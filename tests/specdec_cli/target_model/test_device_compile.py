"""The device engine's step: computed without writing the cache, then stored; its layer compiled (capture.py).

A step's layers write nothing: each returns its block's keys and values, which the step stores after the layers
in one copy, so a compiled layer mutates nothing and the compiler copies nothing. These tests hold that to the
eager prompt path (which writes each layer's keys before its attention), bit for bit, and run the compiled layer
on the CPU (`SPECDEC_DEVICE_COMPILE=1`): every drafter, chains and trees, token-identical to plain decoding on it,
one compilation for every layer, and an eager fallback with a warning where compiling fails.
"""

from __future__ import annotations

import pytest
import torch
from helpers import EOS, PROMPTS, ScriptedTree

from specdec_cli.decoding.cost_curve import CostCurve
from specdec_cli.decoding.engine import Engine
from specdec_cli.decoding.generation_config import GenerationConfig
from specdec_cli.decoding.planner import DraftPlanner
from specdec_cli.drafters import DrafterOptions, TargetInfo, make_drafter
from specdec_cli.target_model.device import ROWS
from specdec_cli.target_model.device.capture import compile_wanted
from specdec_cli.target_model.device.forward import DeviceForward

DRAFTERS = ["pld", "sam", "recycle", "aded", "sam+aded"]


def _engine(forward):
    return Engine(forward, planner=DraftPlanner(CostCurve.fixed({1: 1.0, 64: 1.0})))


def _staged(forward, ids, past):
    inputs = forward.step_inputs
    inputs.write(ids, range(len(ids)), None, past, forward.static.slots - 1)
    return inputs


@torch.inference_mode()
def test_a_step_writes_nothing_until_stored_and_equals_the_writing_path(tiny_llama):
    """decoder.step leaves the cache as it was; store then writes what the writing path (a prompt's) writes, and
    both give the same logits bit for bit."""
    forward = DeviceForward(tiny_llama, "cpu", slots=64)
    cache = forward.new_cache()
    forward(PROMPTS[0] * 3, cache, 0)
    past = cache.get_seq_length()
    before = forward.static.keys.clone(), forward.static.values.clone()
    ids = [5, 9, 11, 3, 7]
    logits, hidden, block = forward.decoder.step(_staged(forward, ids, past))
    assert torch.equal(forward.static.keys, before[0]) and torch.equal(forward.static.values, before[1])
    assert block[0].shape == (len(forward.family.layers), forward.family.kv_heads, ROWS, forward.family.head_dim)
    forward.decoder.store(forward.step_inputs, block)
    stored = forward.static.keys.clone(), forward.static.values.clone()
    forward.static.keys.copy_(before[0])
    forward.static.values.copy_(before[1])
    written_logits, written_hidden = forward.decoder.compute(_staged(forward, ids, past))
    assert torch.equal(logits, written_logits) and torch.equal(hidden, written_hidden)
    assert torch.equal(forward.static.keys, stored[0]) and torch.equal(forward.static.values, stored[1])


def test_compiling_is_on_for_cuda_and_set_by_the_environment(monkeypatch):
    monkeypatch.delenv("SPECDEC_DEVICE_COMPILE", raising=False)
    assert compile_wanted(torch.device("cuda")) and not compile_wanted(torch.device("cpu"))
    monkeypatch.setenv("SPECDEC_DEVICE_COMPILE", "0")
    assert not compile_wanted(torch.device("cuda"))
    monkeypatch.setenv("SPECDEC_DEVICE_COMPILE", "1")
    assert compile_wanted(torch.device("cpu"))


@pytest.mark.slow
def test_a_compiled_step_is_exact_for_every_drafter(tiny_llama, monkeypatch):
    """The compiled layer (compiled once, run by every layer) on the CPU: blocks equal one-row forwards bit for bit,
    and every drafter, a tree with rejections included, answers what plain decoding answers."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("SPECDEC_DEVICE_COMPILE", "1")
    torch._dynamo.reset()
    counters.clear()
    compiled: list = []
    real_compile = torch.compile

    def counting(function, **options):
        compiled.append(options)
        return real_compile(function, **options)

    monkeypatch.setattr(torch, "compile", counting)
    forward = DeviceForward(tiny_llama, "cpu", dtype=torch.bfloat16, slots=128)
    assert forward.decoder.step_layer != forward.decoder.layer and compiled == [{"fullgraph": True, "dynamic": False}]
    engine = _engine(forward)
    assert forward.prepare(8) == ROWS, forward.outcome
    assert forward.step.note.startswith("compiled") and "not compiled" not in forward.step.note
    config = GenerationConfig(max_new_tokens=24, eos_token_ids=(EOS,))
    info = TargetInfo(64, (EOS,))
    for prompt in PROMPTS[:2]:
        plain = engine.generate(prompt, make_drafter("none", DrafterOptions(), info), config)
        for drafter in [make_drafter(name, DrafterOptions(), info) for name in DRAFTERS] + [
                ScriptedTree(plain.tokens, len(prompt), 64)]:
            assert engine.generate(prompt, drafter, config).tokens == plain.tokens, drafter.name
    assert counters["stats"]["unique_graphs"] == 1  # one layer's graph, for every layer and every step
    torch._dynamo.reset()


def test_a_compilation_that_fails_falls_back_to_the_eager_layer(tiny_llama, monkeypatch):
    """A compiler that refuses the step: one warning, the eager layer, the same tokens as an eager forward's."""
    monkeypatch.setenv("SPECDEC_DEVICE_COMPILE", "1")

    def refusing(function, **options):
        def run(*args, **kwargs):
            raise RuntimeError("no C++ compiler here")
        return run

    monkeypatch.setattr(torch, "compile", refusing)
    forward = DeviceForward(tiny_llama, "cpu", slots=64)
    config = GenerationConfig(max_new_tokens=12, eos_token_ids=(EOS,))
    info = TargetInfo(64, (EOS,))
    with pytest.warns(UserWarning, match="not compiled: RuntimeError: no C\\+\\+ compiler here"):
        tokens = _engine(forward).generate(PROMPTS[1], make_drafter("aded", DrafterOptions(), info), config).tokens
    assert forward.decoder.step_layer == forward.decoder.layer and "not compiled" in forward.step.note
    monkeypatch.setenv("SPECDEC_DEVICE_COMPILE", "0")
    eager = DeviceForward(tiny_llama, "cpu", slots=64)
    assert _engine(eager).generate(PROMPTS[1], make_drafter("none", DrafterOptions(), info), config).tokens == tokens
