"""The CPU path's verifying forwards, and row-invariant verification set up in them.

`model_forward(model, exact)` picks one of the two (load/forward_choice.py's `choose_forward` puts the device
engine, device/, before them where the load settings ask for it):

- `NativeForward`: block weights of a model of one of the families native.py computes (families.py: llama,
  mistral, qwen2, qwen3, phi3, smollm3, gemma, gemma2, gemma3_text) run specdec's native decoder, row-invariant by
  construction and checked end to end once, through the first layer of each distinct kind
  (native.NativeDecoder.distinct_layers; remembered per file and machine for a GGUF loaded in place);
- `TransformersForward`: any other model runs transformers' modules; where exactness is on, exact.py's
  row-invariant attention and padded linear layers, found and checked for the largest block a generation may
  verify (`prepare`) and applied around each verify forward only.

In reduced precision (bfloat16, float16) and on block weights, verification is row-invariant by default
(`exact_by_default`), so that speculative output equals plain decoding's. `own_kernels()` sets it aside for the
while: the model's own kernels, as plain decoding outside specdec runs them. What came of it is kept in the
forward's `outcome` (off, not checked, on or failed: check_outcome.py); a failure is said once, as a warning, and
verification goes on without exactness. Each forward object holds all of this itself: nothing is stored on the
model between forwards.

This file does not run the loop (engine.py) nor compute anything row-invariantly itself (exact.py, native.py).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch

from ..native.native import ROW_INVARIANT_ROWS, NativeDecoder, Part
from ..native.native_support import unsupported
from . import exact as row_invariant
from .check_outcome import CheckOutcome
from .forward import ModelForward, Scores

NOT_EXACT_WARNING = ("verification is not row-invariant on this model and machine ({reason}): speculative output "
                     "may differ from plain decoding where rounding decides")


def exact_by_default(model: Any) -> bool:
    """Whether verification is made row-invariant by default: in a 16-bit float type (where a block's rounding
    flips greedy choices) and on block weights (whose kernels are row-invariant at little cost; docs/methods.md,
    section 10)."""
    from ..native.quant import block_layers

    return next(model.parameters()).dtype in (torch.bfloat16, torch.float16) or bool(block_layers(model))


def model_forward(model: Any, exact: Optional[bool] = None) -> "NativeForward | TransformersForward":
    """The forward that verifies on `model` on the CPU path: the native decoder where exactness is on and native.py
    computes the model, else transformers' modules (row-invariant where exactness is on). `exact` None:
    exact_by_default. (load/forward_choice.py puts the device engine before these where the settings ask.)"""
    enabled = exact_by_default(model) if exact is None else exact
    if enabled and unsupported(model) is None:
        return NativeForward(model)
    return TransformersForward(model, enabled)


def states_forward(model: Any) -> ModelForward:
    """A forward whose `run` gives the states entering any of the model's layers (`layer_states`), as drafting's
    forward computes them: the native decoder where it computes the model, else transformers' modules. For
    training and scoring heads on the CPU; the device engine keeps only the last layer's states."""
    return model_forward(model)


class _OwnKernels:
    """`own_kernels()`: a flag the forward reads, set for the while (nested uses nest)."""

    _own = False

    @contextmanager
    def own_kernels(self) -> Iterator[None]:
        saved, self._own = self._own, True
        try:
            yield
        finally:
            self._own = saved


class NativeForward(_OwnKernels, ModelForward):
    """specdec's native decoder (native.py): row-invariant by construction, checked end to end once."""

    def __init__(self, model: Any):
        super().__init__(model, exact=True)
        self.decoder = NativeDecoder(model)

    @property
    def rows(self) -> int:
        return ROW_INVARIANT_ROWS

    def run(self, **inputs: Any) -> Any:
        """The native decoder, or inside own_kernels() the model's own forward."""
        if self._own:
            inputs.pop("hidden_layers", None)  # (transformers' forward gives every layer's states)
            return self.model(**inputs)
        return self.decoder(**inputs)

    def layer_states(self, layers: Sequence[int]) -> dict:
        return {"hidden_layers": tuple(layers)}

    def many(self, blocks: Sequence[tuple[Sequence[int], Any, int]],
             keep: Optional[Sequence[int]] = None) -> list[Scores]:
        """One forward over several sequences' blocks, each (token ids, its cache, the tokens it holds): per
        block, the logits of its last `keep[i]` rows (default: all) [keep[i], vocab] and its rows' features [n,
        hidden], the bits a forward of that block alone gives (native.py `many`). At most ROW_INVARIANT_ROWS rows
        in all."""
        parts = [Part(torch.tensor(list(tokens)), torch.arange(start, start + len(tokens)), cache)
                 for tokens, cache, start in blocks]
        kept = [len(tokens) for tokens, _, _ in blocks] if keep is None else list(keep)
        logits, features = self.decoder.many(parts, kept)  # [sum of kept, vocab], [n, hidden]
        scores, first, row = [], 0, 0
        for (tokens, _, _), count in zip(blocks, kept):
            scores.append(Scores(logits[first : first + count], features[row : row + len(tokens)]))
            first, row = first + count, row + len(tokens)
        return scores

    def prepare(self, budget: int) -> Optional[int]:
        """The native decoder needs no set-up; its row invariance is checked end to end once."""
        if self._own:
            return None
        if self.outcome.state == "not checked":
            passed = f"specdec's native decoder, blocks up to {ROW_INVARIANT_ROWS} rows"
            remembered = _passed_file(self.model)
            if remembered is not None and remembered.is_file():  # this file's blocks, this CPU path: passed before
                self.outcome = CheckOutcome("on", f"{passed} (checked on this machine before)")
                return ROW_INVARIANT_ROWS
            mismatch = row_invariant.block_mismatch(self.decoder.distinct_layers(), self.model.config, self.device,
                                                   ROW_INVARIANT_ROWS)
            self.outcome = (CheckOutcome("on", passed) if mismatch is None else CheckOutcome("failed", mismatch))
            if mismatch is not None:
                warnings.warn(NOT_EXACT_WARNING.format(reason=mismatch), stacklevel=3)
            elif remembered is not None:
                _remember(remembered)
        return ROW_INVARIANT_ROWS if self.outcome.state == "on" else None


class TransformersForward(_OwnKernels, ModelForward):
    """transformers' modules; where exactness is on, exact.py's row-invariant kernels around each verify forward."""

    def __init__(self, model: Any, exact: bool):
        super().__init__(model, exact)
        self.state: Optional[row_invariant.ExactState] = None  # what exact.install found, once prepared
        if exact:  # transformers finds attention functions by name only (exact.py's docstring)
            row_invariant.register_rowwise_attention()

    @property
    def rows(self) -> int:
        return self.state.rows if self.state is not None else 0

    def run(self, **inputs: Any) -> Any:
        """The model's forward, row-invariant once prepared (not inside own_kernels())."""
        if self.state is None or self._own:
            return self.model(**inputs)
        return row_invariant.forward(self.model, self.state, **inputs)

    def prepare(self, budget: int) -> Optional[int]:
        """Row-invariant verification for blocks of this budget (found and checked once; again for a bigger
        budget). Each generation calls it; a session calls it at load, so the check's time (docs/measurements.md)
        is part of loading. Returns the largest row-invariant block, or None when verification is not exact (off,
        inside own_kernels(), or the check failed: said once as a warning, the reason kept in `outcome`)."""
        if not self.exact or self._own:
            return None
        rows = row_invariant.exact_rows(budget)
        state = self.state
        if state is not None and state.rows >= rows:
            return state.rows
        if self.outcome.state == "failed":
            return None
        try:
            self.state = state = row_invariant.install(self.model, rows)
        except ValueError as error:
            self.state = None
            self.outcome = CheckOutcome("failed", str(error))
            warnings.warn(NOT_EXACT_WARNING.format(reason=error), stacklevel=3)
            return None
        padded = ", ".join(f"{inputs}x{outputs}" for inputs, outputs in state.padded_shapes) or "none"
        self.outcome = CheckOutcome("on", f"blocks up to {state.rows} rows; linear shapes padded: {padded}")
        return state.rows


def _passed_file(model: Any) -> Optional[Any]:
    """Where a passed check of this model is remembered: only a GGUF loaded in place (gguf_model.py) has an identity
    cheap to know (its blocks cache, named by the file's path, size and time), kept with the CPU, the kernels' path
    and build and specdec's version; None for any other model (checked at every load)."""
    import hashlib

    from ... import __version__, kernels
    from ...home import specdec_home
    from ...machine import cpu_model

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
    from ...errors import SpecdecError
    from ...files import write_json_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"passed": True})
    except (OSError, SpecdecError):
        pass
