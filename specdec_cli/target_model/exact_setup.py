"""One engine's exactness set-up: which forward verifies, and row-invariant verification installed before it does.

In reduced precision (bfloat16, float16) and on block weights, verification is row-invariant by default
(`exact_by_default`), so that speculative output equals plain decoding's. Block weights of a model of one of the
families native.py computes (native.FAMILIES: llama, mistral, qwen2, qwen3, phi3, smollm3, gemma, gemma2,
gemma3_text) run specdec's native decoder, row-invariant by construction and checked end to end once per engine;
any other model gets exact.py's row-invariant attention and padded linear layers, installed for the largest
block a generation may verify (`ExactSetup.prepare`). `native_kernels` sets all of it aside for the while: the
model's own kernels, as plain decoding outside specdec runs them. What came of it is kept in `outcome` (off,
not checked, on or failed: check_outcome.py); a failure is said once, as a warning, and verification goes on
without exactness.

This file does not run the loop (engine.py) nor compute anything row-invariantly itself (exact.py, native.py).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from . import native
from .check_outcome import CheckOutcome
from .exact import ExactState, block_mismatch, current_state, exact_rows, install, suspended
from .native import ROW_INVARIANT_ROWS

NOT_EXACT_WARNING = ("verification is not row-invariant on this model and machine ({reason}): speculative output "
                     "may differ from plain decoding where rounding decides")


def exact_by_default(model: Any) -> bool:
    """Whether verification is made row-invariant by default: in a 16-bit float type (where a block's rounding
    flips greedy choices) and on block weights (whose kernels are row-invariant at little cost; docs/methods.md,
    section 10)."""
    from .quant import block_layers

    return next(model.parameters()).dtype in (torch.bfloat16, torch.float16) or bool(block_layers(model))


class ExactSetup:
    """Row-invariant verification for one engine's model (see the module docstring)."""

    def __init__(self, model: Any, exact: Optional[bool] = None):
        self.model = model
        self.enabled = exact_by_default(model) if exact is None else exact
        self.state: Optional[ExactState] = None  # exact.py's install, when it is what makes verification exact
        self.outcome = CheckOutcome("not checked" if self.enabled else "off")  # on or failed once installed
        # block weights of a native.FAMILIES model: specdec's own forward, row-invariant by construction
        self.native = native.decoder_for(model) if self.enabled else None
        self._own_kernels = False  # inside native_kernels(): transformers' forward on the model's own kernels

    @property
    def forward(self) -> Any:
        """What a forward calls: the native decoder, or the model itself (its own or exact.py's kernels)."""
        return self.native if self.native is not None and not self._own_kernels else self.model

    @property
    def rows(self) -> int:
        """The largest block verified row-invariantly (0: none); part of the cost curve's key."""
        if self.state is not None:
            return self.state.rows
        return ROW_INVARIANT_ROWS if self.native else 0

    def prepare(self, budget: int) -> Optional[int]:
        """Install row-invariant verification for blocks of this budget (once; again for a bigger budget).

        Each generation does it; a session calls it at load, so the check's time (docs/measurements.md) is part
        of loading. Returns the largest row-invariant block, or None when verification is not exact (off, or the
        check failed: said once as a warning, the reason kept in `outcome`)."""
        if not self.enabled:
            return None
        if self.native is not None:
            return self._prepare_native()
        rows = exact_rows(budget)
        current = current_state(self.model)
        if current is not None and current.suspended:  # inside native_kernels: the model's own kernels
            return None
        state = self.state
        if state is not None and state.rows >= rows and state.applied(self.model):
            return state.rows
        if self.outcome.state == "failed":
            return None
        try:  # (the model keeps its state: another engine's install is reused, a smaller one replaced)
            self.state = state = install(self.model, max(rows, state.rows if state is not None else 0))
        except ValueError as error:
            self.state = None
            self.outcome = CheckOutcome("failed", str(error))
            warnings.warn(NOT_EXACT_WARNING.format(reason=error), stacklevel=4)
            return None
        padded = ", ".join(f"{inputs}x{outputs}" for inputs, outputs in state.padded_shapes) or "none"
        self.outcome = CheckOutcome("on", f"blocks up to {state.rows} rows; linear shapes padded: {padded}")
        return state.rows

    def _prepare_native(self) -> Optional[int]:
        """The native decoder needs no set-up; its row invariance is checked end to end once per engine."""
        if self._own_kernels:
            return None
        if self.outcome.state == "not checked":
            passed = f"specdec's native decoder, blocks up to {ROW_INVARIANT_ROWS} rows"
            remembered = _passed_file(self.model)
            if remembered is not None and remembered.is_file():  # this file's blocks, this CPU path: passed before
                self.outcome = CheckOutcome("on", f"{passed} (checked on this machine before)")
                return ROW_INVARIANT_ROWS
            device = next(self.model.parameters()).device
            mismatch = block_mismatch(self.native, self.model.config, device, ROW_INVARIANT_ROWS)
            self.outcome = (CheckOutcome("on", passed) if mismatch is None else CheckOutcome("failed", mismatch))
            if mismatch is not None:
                warnings.warn(NOT_EXACT_WARNING.format(reason=mismatch), stacklevel=4)
            elif remembered is not None:
                _remember(remembered)
        return ROW_INVARIANT_ROWS if self.outcome.state == "on" else None

    def native_kernels(self) -> Any:
        """A context in which the model runs its own kernels (exact verification suspended): transformers'
        forward, with the native decoder (if any) set aside."""
        if self.native is not None:
            return self._set_aside_native()
        return suspended(self.model, current_state(self.model) if self.state is not None else None)

    @contextmanager
    def _set_aside_native(self) -> Iterator[None]:
        saved, self._own_kernels = self._own_kernels, True
        try:
            yield
        finally:
            self._own_kernels = saved


def _passed_file(model: Any) -> Optional[Any]:
    """Where a passed check of this model is remembered: only a GGUF loaded in place (gguf_model.py) has an identity
    cheap to know (its blocks cache, named by the file's path, size and time), kept with the CPU, the kernels' path
    and build and specdec's version; None for any other model (checked at every load)."""
    import hashlib

    from .. import __version__, kernels
    from ..home import specdec_home
    from ..machine import cpu_model

    source = getattr(model, "source", None)
    cache = getattr(source, "cache", None)
    if cache is None or not kernels.available():
        return None
    build = kernels.build_file() or ""
    try:
        stamp = f"{build}:{Path(build).stat().st_mtime_ns}"
    except OSError:
        return None
    key = f"{cache.name}|{cpu_model()}|{kernels.isa()}|{stamp}|{__version__}|{ROW_INVARIANT_ROWS}"
    return specdec_home() / "checks" / f"exact-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _remember(path: Any) -> None:
    """Best effort: a home specdec cannot write only costs the check again next time."""
    from ..errors import SpecdecError
    from ..files import write_json_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"passed": True})
    except (OSError, SpecdecError):
        pass
