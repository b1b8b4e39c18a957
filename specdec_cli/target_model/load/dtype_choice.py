"""`--dtype auto` and `--weights auto`: the fastest way to run one model on this machine, measured once and cached.

Dtype: on a GPU, auto means bfloat16 (or float16 where bfloat16 is not supported), as everywhere. On a CPU,
bfloat16 is only a candidate where the CPU computes it natively (AVX512-BF16 or AMX); there one plain decoding
step is timed in both dtypes (the model is loaded in float32, timed, cast to bfloat16 in place and timed again),
and bfloat16 is kept when it is at least MARGIN faster.
Weights: a GGUF target on a CPU is timed dense (in the dtype above) and on the GGUF's own blocks (quant.py), and
the blocks are kept when a plain step on them is faster.
Verdicts are cached under $SPECDEC_HOME/costs per model, CPU, thread count and torch version, so the timing runs
once. A timing is a fixed number of forwards (WARM_UP_STEPS, then TIMED_STEPS), so a busy machine measures slower
but never longer; like the verify-cost curve, the measurement can be handed in instead (`timer`: tests, replays).
Exactness does not depend on the choice: 16-bit and block-weight verification is row-invariant (exact.py).
This file does not load models (models.py does; it hands in the loaders).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import families

MARGIN = 0.10  # bfloat16 is chosen when one plain step is at least 10% faster than in float32
FORMAT = 1
WARM_UP_STEPS = 2  # untimed one-token forwards before the timed ones
TIMED_STEPS = 5  # timed one-token forwards; the fastest counts

StepTimer = Callable[[Any], float]  # model -> seconds of one plain decoding step, as `step_seconds` measures it


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # "float32" or "bfloat16"
    reason: str  # one line: why, with the measured times when there were any


def native_bfloat16_cpu() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX tiles), as torch sees it."""
    import torch

    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check is not None and check() for check in checks)


def step_seconds(model: Any, prefix: int = 64, rounds: int = TIMED_STEPS) -> float:
    """The fastest of `rounds` one-token forwards after a `prefix`-token cache (WARM_UP_STEPS forwards first):
    one prefill and WARM_UP_STEPS + rounds steps in all, whatever the machine's load."""
    import torch

    from ..native.kv_cache import new_kv_cache
    from ..native.native import decoder_for

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, int(model.config.vocab_size), (1, prefix + 1), generator=generator)
    device = next(model.parameters()).device
    ids = ids.to(device)
    forward = decoder_for(model) or model  # the forward the engine will run
    best = float("inf")
    with torch.inference_mode():
        cache = new_kv_cache(model)
        forward(input_ids=ids[:, :prefix], position_ids=torch.arange(prefix, device=device)[None],
                past_key_values=cache, use_cache=True)
        for attempt in range(WARM_UP_STEPS + rounds):
            started = time.perf_counter()
            forward(input_ids=ids[:, prefix:], position_ids=torch.tensor([[prefix]], device=device),
                    past_key_values=cache, use_cache=True)
            if attempt >= WARM_UP_STEPS:
                best = min(best, time.perf_counter() - started)
            cache.crop(prefix - cache.get_seq_length())
    return best


def choose_cpu_dtype(model: Any, cache_key: str, timer: Optional[StepTimer] = None) -> DtypeChoice:
    """For a float32 model on a CPU: the dtype to run it in. Leaves the model in that dtype (cast in place).
    `timer` times one plain step (default `step_seconds`)."""
    import torch

    timer = timer or step_seconds

    if not native_bfloat16_cpu():
        return DtypeChoice("float32", "auto: float32 (this CPU has no native bfloat16)")
    cached = _read(cache_key, ("float32_ms", "bfloat16_ms"))
    if cached is None:
        float32_ms = timer(model) * 1000
        model.to(torch.bfloat16)
        bfloat16_ms = timer(model) * 1000
        cached = {"format": FORMAT, "float32_ms": round(float32_ms, 2), "bfloat16_ms": round(bfloat16_ms, 2)}
        _write(cache_key, cached)
    float32_ms, bfloat16_ms = float(cached["float32_ms"]), float(cached["bfloat16_ms"])
    times = f"one plain step {bfloat16_ms:.1f} ms in bfloat16, {float32_ms:.1f} ms in float32"
    if bfloat16_ms <= (1 - MARGIN) * float32_ms:
        model.to(torch.bfloat16)
        return DtypeChoice("bfloat16", f"auto: bfloat16 ({times})")
    if next(model.parameters()).dtype != torch.float32:
        return DtypeChoice("reload", f"auto: float32 ({times})")  # the caller reloads: a cast back loses bits
    return DtypeChoice("float32", f"auto: float32 ({times})")


@dataclass
class WeightsChoice:
    weights: str  # "gguf" (the GGUF's own blocks) or "dense"
    model: Any  # the model as chosen (block layers installed, or dense in its dtype)
    reason: str  # one line: why, with the measured times
    dtype_reason: str = ""  # for a dense choice: how its dtype was chosen


def choose_weights(model: Any, cache_key: str, dtype: str, reload_float32: Callable[[], Any],
                   to_blocks: Callable[[Any], str], timer: Optional[StepTimer] = None) -> WeightsChoice:
    """For a float32 dense model from a GGUF on a CPU: its own blocks when one plain step on them is faster than
    dense in the dtype `dtype` (auto or float32) would run. `to_blocks(model)` installs the blocks in place and
    returns their summary; `reload_float32()` loads the dense model again (a cast back to float32 loses bits).
    `timer` times one plain step (default `step_seconds`)."""
    import torch

    timer = timer or step_seconds

    from ... import kernels
    from .weights_cache import CACHE_FORMAT

    forward = "native" if families.is_native(model.config.model_type) else "transformers"  # what runs the blocks
    key = f"weights|{cache_key}|{kernels.isa()}|{CACHE_FORMAT}|{forward}"
    record = _read(key, ("dense_ms", "blocks_ms"))
    summary = ""
    if record is None:
        dense_dtype, dense_ms = "float32", timer(model) * 1000
        if dtype == "auto" and native_bfloat16_cpu():
            if choose_cpu_dtype(model, cache_key, timer).dtype == "bfloat16":
                measured = _read(cache_key, ("float32_ms", "bfloat16_ms")) or {}
                dense_dtype, dense_ms = "bfloat16", float(measured.get("bfloat16_ms", dense_ms))
            if next(model.parameters()).dtype != torch.float32:
                model = reload_float32()
        summary = to_blocks(model)
        record = {"format": FORMAT, "dense_ms": round(dense_ms, 2), "dense_dtype": dense_dtype,
                  "blocks_ms": round(timer(model) * 1000, 2)}
        _write(key, record)
    dense_ms, blocks_ms = float(record["dense_ms"]), float(record["blocks_ms"])
    dense_dtype = str(record.get("dense_dtype", "float32"))
    times = f"one plain step {blocks_ms:.1f} ms on its blocks, {dense_ms:.1f} ms dense in {dense_dtype}"
    if blocks_ms < dense_ms:
        summary = summary or to_blocks(model)
        return WeightsChoice("gguf", model, f"auto: gguf blocks ({times}); {summary}")
    if summary:  # the blocks were installed to be timed: back to the dense weights
        model = reload_float32()
    dtype_reason = "float32"
    if dtype == "auto":
        choice = choose_cpu_dtype(model, cache_key, timer)
        if choice.dtype == "reload":
            model = reload_float32()
        dtype_reason = choice.reason
    return WeightsChoice("dense", model, f"auto: dense ({times})", dtype_reason)


def _path(cache_key: str) -> Any:
    from ...home import specdec_home

    digest = hashlib.sha256(cache_key.encode()).hexdigest()[:16]
    return specdec_home() / "costs" / f"dtype-{digest}.json"


def _read(cache_key: str, times: tuple[str, ...]) -> Optional[dict]:
    """The cached verdict for this key, when it holds every one of `times` as a number."""
    from ...files import read_json_bounded

    try:
        document = read_json_bounded(_path(cache_key))
    except (OSError, ValueError):
        return None
    ok = isinstance(document, dict) and document.get("format") == FORMAT
    return document if ok and all(isinstance(document.get(key), (int, float)) for key in times) else None


def _write(cache_key: str, document: dict) -> None:
    from ...errors import SpecdecError
    from ...files import write_atomic

    path = _path(cache_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(document).encode())
    except (OSError, SpecdecError):
        pass  # a read-only home only costs a measurement next time
