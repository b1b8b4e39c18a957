"""`--dtype auto`'s choice with its timing handed in (no test depends on this machine's speed), and the timing
itself bounded by a count of forwards."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec_cli.target_model.load import dtype_choice
from specdec_cli.target_model.load.dtype_choice import TIMED_STEPS, WARM_UP_STEPS, choose_cpu_dtype, step_seconds


def _timer(float32: float, bfloat16: float, calls: list):
    """A step timer that says `float32` or `bfloat16` seconds by the model's dtype, and counts its calls."""

    def timed(model) -> float:
        dtype = next(model.parameters()).dtype
        calls.append(dtype)
        return bfloat16 if dtype == torch.bfloat16 else float32

    return timed


@pytest.fixture
def native_bfloat16(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))  # verdicts cached here, not in the user's home
    monkeypatch.setattr(dtype_choice, "native_bfloat16_cpu", lambda: True)


def test_bfloat16_is_chosen_when_the_handed_in_timing_says_it_is_faster(tiny_llama, native_bfloat16):
    model, calls = copy.deepcopy(tiny_llama), []
    choice = choose_cpu_dtype(model, "tiny|bf16-faster", _timer(0.010, 0.005, calls))
    assert choice.dtype == "bfloat16" and next(model.parameters()).dtype == torch.bfloat16
    assert choice.reason == "auto: bfloat16 (one plain step 5.0 ms in bfloat16, 10.0 ms in float32)"
    assert calls == [torch.float32, torch.bfloat16]
    again = choose_cpu_dtype(copy.deepcopy(tiny_llama), "tiny|bf16-faster", _timer(1.0, 1.0, calls))
    assert again == choice and len(calls) == 2  # the verdict is cached: timed once per model and machine


def test_float32_stays_when_bfloat16_is_not_faster_by_the_margin(tiny_llama, native_bfloat16):
    model, calls = copy.deepcopy(tiny_llama), []
    choice = choose_cpu_dtype(model, "tiny|bf16-slower", _timer(0.010, 0.0095, calls))
    assert choice.dtype == "reload"  # the model was cast to bfloat16 to be timed: the loader reloads float32
    assert choice.reason == "auto: float32 (one plain step 9.5 ms in bfloat16, 10.0 ms in float32)"


def test_without_native_bfloat16_nothing_is_timed(tiny_llama, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    monkeypatch.setattr(dtype_choice, "native_bfloat16_cpu", lambda: False)
    calls: list = []
    choice = choose_cpu_dtype(copy.deepcopy(tiny_llama), "tiny|no-bf16", _timer(1.0, 1.0, calls))
    assert choice.dtype == "float32" and calls == []


def test_load_target_hands_its_timer_to_the_choice(tiny_model_dir, native_bfloat16, monkeypatch):
    from specdec_cli.target_model.load.models import load_target

    monkeypatch.delenv("SPECDEC_DTYPE", raising=False)
    calls: list = []
    loaded = load_target(tiny_model_dir, "cpu", "auto", step_timer=_timer(0.010, 0.004, calls))
    assert loaded.dtype == torch.bfloat16 and calls == [torch.float32, torch.bfloat16]
    assert loaded.dtype_reason == "auto: bfloat16 (one plain step 4.0 ms in bfloat16, 10.0 ms in float32)"


def test_a_step_timing_runs_a_fixed_number_of_forwards(tiny_llama):
    """However loaded the machine, the measurement is one prefill and WARM_UP_STEPS + TIMED_STEPS steps."""
    model, shapes = copy.deepcopy(tiny_llama), []
    original = model.forward

    def counting(*args, **kwargs):
        shapes.append(kwargs["input_ids"].shape[-1])
        return original(*args, **kwargs)

    model.forward = counting
    assert step_seconds(model) > 0
    assert shapes == [64] + [1] * (WARM_UP_STEPS + TIMED_STEPS)
