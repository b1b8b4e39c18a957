"""Where an engine's verify-cost curve is kept between sessions, and how the engine's forward is timed to make one.

A curve is stored per model and machine under $SPECDEC_HOME/costs/KEY.json, KEY from the model, device, CPU, dtype,
threads, torch version, exact rows and block weights (`cost_cache_file`). Without a stored curve, one is measured by
timing the engine's own forward (`forward_timer`, cost_curve.measure_cost_curve) and stored. What a session's steps
teach the curve is saved back every SAVE_EVERY observations and SAVE_SECONDS at most (`CurveStore.keep`), as the
next session's starting point. A curve can also be given outright (the planner's, in tests and replays); then none
is read, measured or stored here. The curve itself and how it learns are cost_curve.py's; planning is planner.py's.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ..defaults import TIMED_PREFIX, VERIFY_ROW_COUNTS
from ..errors import SpecdecError
from ..files import read_json, write_json_atomic
from ..home import specdec_home
from ..machine import cpu_model
from ..target_model.verify.forward import VerifyForward
from ..target_model.verify.rollback import truncate_cache
from .cost_curve import CostCurve, measure_cost_curve

SAVE_EVERY = 16  # observations a curve learns between two saves ...
SAVE_SECONDS = 30.0  # ... and seconds (a save is a synced write: ~10 ms, a server's request or two tokens' time)

Timer = Callable[[int], float]  # rows -> seconds of one forward of that many new tokens


class CurveStore:
    """One engine's stored curve. Its file is named when needed: the key includes the exact rows, which are
    known once verification is set up (and grow with a bigger budget)."""

    def __init__(self, file: Callable[[], Optional[Path]], make_timer: Callable[[], Timer],
                 key: Callable[[], Any] = lambda: None):
        self._file = file
        self._key = key  # what the file's name depends on that can change (the exact rows): named once per value
        self._named: dict[Any, Optional[Path]] = {}
        self.make_timer = make_timer
        self.saved_observations = 0
        self.saved_at = -SAVE_SECONDS

    @classmethod
    def of_forward(cls, model: Any, forward: VerifyForward) -> "CurveStore":
        """The store of an engine's curve: named by the model and the forward's exact rows (`cost_cache_file`),
        measured by timing the forward."""
        return cls(lambda: cost_cache_file(model, forward.rows), lambda: forward_timer(forward),
                   key=lambda: (forward.rows, torch.get_num_threads()))

    def file(self) -> Optional[Path]:
        key = self._key()
        if key not in self._named:
            self._named[key] = self._file()  # (hashes the model's description: milliseconds)
        return self._named[key]

    def load_or_measure(self) -> CostCurve:
        """The curve stored for this machine and model as a prior, else measured now and stored."""
        return load_or_measure(self.file(), self.make_timer)

    def keep(self, curve: CostCurve) -> None:
        """Store what the steps taught the curve since the last save, if that is SAVE_EVERY observations or more
        and SAVE_SECONDS have passed (what the last seconds of a session taught is not kept: a prior, not a
        record)."""
        now = time.monotonic()
        if curve.learn and curve.observations - self.saved_observations >= SAVE_EVERY and \
                now - self.saved_at >= SAVE_SECONDS:
            self.saved_observations, self.saved_at = curve.observations, now
            try:
                save_curve(self.file(), curve)
            except SpecdecError:
                pass  # a read-only cache is no reason to fail a generation


def load_or_measure(cache_file: Optional[Path], make_timer: Callable[[], Timer]) -> CostCurve:
    """The curve stored in `cache_file` as a prior, else measured now with `make_timer()` and stored."""
    if cache_file is not None:
        stored = read_json(cache_file)
        try:
            return CostCurve.from_json(stored)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # missing, damaged, or of an older format: measure again
    curve = measure_cost_curve(make_timer())
    try:
        save_curve(cache_file, curve)
    except SpecdecError as exc:  # a read-only or full home still answers: the curve is measured again next time
        import warnings

        warnings.warn(f"the verify-cost curve was not saved ({exc}); it is measured again next time", stacklevel=2)
    return curve


def save_curve(cache_file: Optional[Path], curve: CostCurve) -> None:
    """Store the curve's current estimates as the next session's prior (atomically); SpecdecError when the home
    cannot take it."""
    if cache_file is None:
        return

    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecdecError(f"{cache_file.parent}: cannot write ({exc.strerror or exc})") from exc
    write_json_atomic(cache_file, {**curve.as_json(), "saved": time.time()})


def cost_cache_file(model: Any, exact_rows: int) -> Optional[Path]:
    """$SPECDEC_HOME/costs/KEY.json, KEY from the model, device, CPU, dtype, threads, torch version, the rows
    verified row-invariantly (0: none) and block weights (with the kernels' path, build and record format, and the
    native decoder's KV cache dtype: each changes what a step costs). None for an in-memory model (tests):
    measured, not stored."""
    from .. import kernels
    from ..target_model.load.weights_cache import CACHE_FORMAT
    from ..target_model.native.kv_cache import native_cache_dtype
    from ..target_model.native.quant import block_layers, weights_summary

    name = getattr(model.config, "_name_or_path", "") or ""
    if not name:
        return None
    params = sum(p.numel() for p in model.parameters())
    first = next(model.parameters())
    # block weights: their kernels' path, build and layout too (a rebuilt kernel measures its own curve), and the cache
    blocks = (f"|{weights_summary(model)}|{kernels.isa()}|{kernels.build()}|{CACHE_FORMAT}|{native_cache_dtype()}"
              if block_layers(model) else "")
    key = (f"{name}|{params}|{first.device}|{cpu_model()}|{first.dtype}|{torch.get_num_threads()}|"
           f"{torch.__version__}" + (f"|exact{exact_rows}" if exact_rows else "") + blocks)
    return specdec_home() / "costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def forward_timer(forward: VerifyForward, prefix: int = TIMED_PREFIX) -> Timer:
    """A function n -> seconds of one forward of n new tokens (up to 64) after a `prefix`-token cache (filled now);
    a shorter prefix where the forward's cache cannot hold it and the largest timed block (a device engine on a
    model of a short context)."""
    if forward.capacity is not None:
        prefix = max(1, min(prefix, forward.capacity - max(VERIFY_ROW_COUNTS)))
    generator = torch.Generator().manual_seed(0)
    vocab = forward.model.config.vocab_size
    ids = torch.randint(0, vocab, (prefix + 64,), generator=generator).tolist()
    cache = forward.new_cache()
    with torch.inference_mode():
        forward(ids[:prefix], cache, 0, last_only=True)
    on_gpu = forward.device.type == "cuda"

    @torch.inference_mode()
    def timed(tokens: int) -> float:
        if on_gpu:
            torch.cuda.synchronize()
        started = time.perf_counter()
        forward(ids[prefix : prefix + tokens], cache, prefix)
        if on_gpu:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        truncate_cache(cache, prefix)
        return elapsed

    return timed
