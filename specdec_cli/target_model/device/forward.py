"""`DeviceForward`: the engine's verifying forward (target_model/forward.VerifyForward) on the device engine.

Made once per loaded target (load/forward_choice.choose_forward picks it: `--decoder device`, or on cuda by
default): the weights put on the device (weights.py: at the file's bits where `packed`, by default on cuda with
Triton), the static cache allocated (cache.py), the step decoder
(decoder.py) and its capture (capture.py). A call scores n tokens after `start` committed ones:

- a block of n <= ROWS rows (plain decoding's one row, a chain, a token tree) is one step at ROWS padded rows,
  the captured graph where capture is on; more rows (a chain: the cost curve's timer) run as consecutive steps;
- a prompt (start 0, more than ROWS rows) runs eagerly, outside the graph, in chunks of ROWS * 2^k padded rows
  (up to PREFILL_ROWS) set by its length alone: the same for plain and speculative decoding, so the committed
  cache is the same for both.

Its outputs are copies on the device (the graph's buffers are overwritten by the next step); reading them back
(the accepted tokens) is the caller's one host synchronisation per step. `prepare` checks once, bit for bit, that
blocks of 1..8 rows and a tree equal one-row forwards (row invariance is by construction; the check makes a
broken device or library say so, as a warning, instead of answering differently). `tree_outcome` answers the
engine's tree check from it, since a tree runs through the same step as a chain. `capacity` bounds the committed
tokens (the cache's slots less one block); `max_block` bounds a verify block (the engine drafts at most
ROWS - 1 tokens a step). Every call is checked against the slots its padded rows reach (`slots_needed`); a user's
SPECDEC_DEVICE_CONTEXT (`context_setting`) is refused in one line below MIN_CONTEXT, the slots the engine's own
check and its verify-cost timer need.
"""

from __future__ import annotations

import os
import warnings
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch

from ...defaults import TIMED_PREFIX, VERIFY_ROW_COUNTS
from ...errors import SpecdecError
from ..verify.check_outcome import CheckOutcome
from ..verify.forward import Scores
from ..verify.tree_mask import tree_paths
from . import CONTEXT, PREFILL_ROWS, ROWS
from .cache import DeviceCache, StaticCache
from .capture import StepGraph, compile_wanted
from .decoder import DeviceDecoder
from .family import describe, unsupported
from .inputs import StepInputs
from .weights import DeviceWeights, packed_wanted

CHECK_PROMPT = 24  # tokens before the one-time check's blocks
CHECK_ROWS = 8  # the check compares blocks of 1..CHECK_ROWS rows with one-row forwards
CONTEXT_VARIABLE = "SPECDEC_DEVICE_CONTEXT"  # the static cache's slots, where a user sets them


def prefill_rows(tokens: int) -> int:
    """The padded rows of a prompt's chunks: the smallest ROWS * 2^k (up to PREFILL_ROWS) that holds `tokens`."""
    size = ROWS
    while size < min(tokens, PREFILL_ROWS):
        size *= 2
    return size


def slots_needed(start: int, count: int) -> int:
    """The fewest cache slots a forward of `count` tokens after `start` committed ones needs: a slot for each token
    and the last slot for the padding rows, and a position inside the rotary tables for every padded row (a chunk
    runs at its padded size: ROWS rows a step, prefill_rows for a prompt of more than ROWS tokens)."""
    size = prefill_rows(count) if start == 0 and count > ROWS else ROWS
    return max(start + count + 1, start + -(-count // size) * size)


# The fewest slots SPECDEC_DEVICE_CONTEXT may set (289): the one-time check's last one-row forward, and the verify-cost
# curve's timer (a TIMED_PREFIX-token prompt, then blocks of up to the largest of VERIFY_ROW_COUNTS rows) fit.
MIN_CONTEXT = max(slots_needed(CHECK_PROMPT + CHECK_ROWS - 1, 1), slots_needed(0, TIMED_PREFIX),
                  slots_needed(TIMED_PREFIX, max(VERIFY_ROW_COUNTS)))


def context_setting(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """SPECDEC_DEVICE_CONTEXT as a number of cache slots (None where unset or empty), or one line saying what it
    takes: a whole number of at least MIN_CONTEXT."""
    text = (os.environ if environ is None else environ).get(CONTEXT_VARIABLE, "").strip()
    if not text:
        return None
    slots = int(text) if text.isdecimal() else 0
    if slots < MIN_CONTEXT:
        raise SpecdecError(f"{CONTEXT_VARIABLE} must be a whole number of cache slots of at least {MIN_CONTEXT} (the "
                           f"verify-cost curve times blocks of up to {max(VERIFY_ROW_COUNTS)} tokens after "
                           f"{TIMED_PREFIX}, each padded to {ROWS} rows), got {text!r}")
    return slots


def context_slots(model: Any, device: torch.device, slots: Optional[int] = None) -> int:
    """The static cache's slots: `slots`, else SPECDEC_DEVICE_CONTEXT (context_setting), else CONTEXT for the device
    type; never more than the model's context plus one block."""
    chosen = slots or context_setting() or CONTEXT.get(device.type, 1024)
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    return min(chosen, limit + ROWS) if limit > 0 else chosen


class DeviceForward:
    """The device engine as the engine's forward (see the module docstring)."""

    exact = True
    has_own_kernels = False  # plain decoding runs the same step: the bench's `native` row would time it twice
    static_cache = True

    def __init__(self, model: Any, device: "str | torch.device", dtype: Optional[torch.dtype] = None,
                 slots: Optional[int] = None, packed: Optional[bool] = None):
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"the device engine cannot run this model: {reason}")
        self.model = model
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.family = describe(model)
        self.weights = DeviceWeights.load(model, self.family, self.device, self.dtype,
                                          packed_wanted(self.device, model, self.dtype) if packed is None else packed)
        count = context_slots(model, self.device, slots)
        self.static = StaticCache(len(self.family.layers), self.family.kv_heads, count, self.family.head_dim,
                                  self.dtype, self.device, ROWS)
        compiled = compile_wanted(self.device)
        self.decoder = DeviceDecoder(self.family, self.weights, self.static, compiled=compiled)
        self.step_inputs = StepInputs(ROWS, self.device)
        self.prefill_inputs: dict[int, StepInputs] = {}  # by padded size: ROWS * 2^k up to PREFILL_ROWS
        self.step = StepGraph(self._step, self.device, uncompile=self.decoder.uncompile if compiled else None)
        self.outcome = CheckOutcome("not checked")
        self._cache: Optional[DeviceCache] = None

    # -- what the engine reads -----------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        return ROWS

    @property
    def max_block(self) -> int:
        return ROWS

    @property
    def capacity(self) -> int:
        """Committed tokens the cache holds with room for one more block."""
        return self.static.slots - ROWS

    def describe(self) -> str:
        weights = "at the file's bits" if self.weights.packed else "dequantised"
        return (f"specdec's device engine on {self.device} in {str(self.dtype).removeprefix('torch.')}, weights "
                f"{weights}, {ROWS} padded rows a step, {self.static.slots} cache slots, step {self.step.note}")

    def memory(self) -> Optional[dict[str, int]]:
        """Bytes on the device: the weights (matrices and embeddings), the static cache, and on cuda the device's
        peak allocation since the process began."""
        cache = self.static.keys.numel() * self.static.keys.element_size() * 2
        found = {"weights_bytes": self.weights.nbytes, "kv_cache_bytes": cache}
        if self.device.type == "cuda":
            found["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return found

    def new_cache(self) -> DeviceCache:
        """An empty cache over the static buffers (the previous view must not be used after this)."""
        self._cache = self.static.view()
        return self._cache

    def own_kernels(self) -> AbstractContextManager[None]:
        """The device engine has no other kernels: plain decoding runs the same step."""
        return nullcontext()

    # -- the forward -------------------------------------------------------------------------------------------

    def __call__(self, token_ids: Sequence[int], cache: Any, start: int, last_only: bool = False,
                 tree: Optional[Sequence[int]] = None, features: bool = False,
                 feature_layers: Sequence[int] = ()) -> Scores:
        if features and feature_layers:
            raise SpecdecError("the device engine gives only the last layer's states: a head that reads middle "
                               "layers (EAGLE-3's) drafts with --decoder native")
        if not isinstance(cache, DeviceCache) or cache.static is not self.static:
            raise TypeError("the device engine computes on its own cache: make it with forward.new_cache()")
        if cache.get_seq_length() != start:
            raise ValueError(f"the cache holds {cache.get_seq_length()} tokens, not {start}")
        ids = [int(token) for token in token_ids]
        needed = slots_needed(start, len(ids))
        if needed > self.static.slots:  # (the engine keeps within `capacity`: its blocks fit)
            raise ValueError(f"a block of {len(ids)} after {start} committed tokens needs {needed} slots with its "
                             f"padding rows; the device engine has {self.static.slots}")
        if tree is not None:
            if len(ids) > ROWS:
                raise ValueError(f"a tree block has at most {ROWS} rows on the device engine")
            depth, ancestors = tree_paths(tree)
            return self._block(ids, depth, ancestors, cache, start, last_only, features, self.step_inputs, self.step)
        if start == 0 and len(ids) > ROWS:  # a prompt: eager chunks of a size set by its length alone
            inputs = self._prefill_inputs(len(ids))
            size, run = inputs.rows, lambda: self.decoder.compute(inputs)
        else:
            inputs, size, run = self.step_inputs, ROWS, self.step
        parts: list[Scores] = []
        for first in range(0, len(ids), size):
            chunk = ids[first : first + size]
            last = first + size >= len(ids)
            parts.append(self._block(chunk, range(len(chunk)), None, cache, start + first, last_only and last,
                                     features, inputs, run))
        if len(parts) == 1:
            return parts[0]
        logits = parts[-1].logits if last_only else torch.cat([part.logits for part in parts])
        hidden = torch.cat([part.features for part in parts]) if features else None  # type: ignore[misc]
        return Scores(logits, hidden)

    def _block(self, ids: list[int], depth: Sequence[int], ancestors: Optional[np.ndarray], cache: DeviceCache,
               start: int, last_only: bool, features: bool, inputs: StepInputs, run: Any) -> Scores:
        """One padded forward of len(ids) <= inputs.rows real rows: logits [n or 1, vocab], hidden [n, hidden]."""
        n = len(ids)
        inputs.write(ids, depth, ancestors, start, self.static.slots - 1)
        logits, hidden = run()  # [rows, vocab], [rows, hidden]: the step's buffers
        cache.advance(n)
        kept = logits[n - 1 : n] if last_only else logits[:n]
        return Scores(kept.clone(), hidden[:n].clone() if features else None)

    def _step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The step the graph captures: the staged rows computed, then their keys and values stored."""
        logits, hidden, block = self.decoder.step(self.step_inputs)
        self.decoder.store(self.step_inputs, block)
        return logits, hidden

    def _prefill_inputs(self, tokens: int) -> StepInputs:
        """The inputs of a prompt's chunks, of prefill_rows(tokens) rows, made once per size."""
        size = prefill_rows(tokens)
        if size not in self.prefill_inputs:
            self.prefill_inputs[size] = StepInputs(size, self.device)
        return self.prefill_inputs[size]

    # -- the one-time check ----------------------------------------------------------------------------------

    def prepare(self, budget: int) -> Optional[int]:
        """Check once that blocks equal one-row forwards bit for bit; ROWS when they do (None: not exact, said once
        as a warning)."""
        if self.outcome.state == "not checked":
            mismatch = self.mismatch()
            self.outcome = CheckOutcome("on", self.describe()) if mismatch is None else CheckOutcome("failed", mismatch)
            if mismatch is not None:
                warnings.warn(f"the device engine's blocks differ from one-row forwards ({mismatch}): speculative "
                              "output may differ from plain decoding", stacklevel=3)
        return ROWS if self.outcome.state == "on" else None

    def tree_outcome(self) -> CheckOutcome:
        """The engine's tree check: a tree is a block of the same step, checked by `prepare`."""
        self.prepare(0)
        if self.outcome.state == "on":
            return CheckOutcome("passed")
        return CheckOutcome("failed", self.outcome.detail)

    @torch.inference_mode()
    def mismatch(self) -> Optional[str]:
        """None when blocks of 1..CHECK_ROWS tokens (chains) and a tree give the same logits, bit for bit, as
        one-row forwards of the same tokens after a CHECK_PROMPT-token prompt; else what differed."""
        vocab = self.family.vocab
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(3, vocab, (CHECK_PROMPT + CHECK_ROWS,), generator=generator).tolist()
        prompt = tokens[:CHECK_PROMPT]
        cache = self.new_cache()
        self(prompt, cache, 0, last_only=True)
        one_row = [self(tokens[CHECK_PROMPT + index : CHECK_PROMPT + index + 1], cache, CHECK_PROMPT + index).logits[0]
                   for index in range(CHECK_ROWS)]
        differ = []
        for count in range(1, CHECK_ROWS + 1):
            cache.crop(CHECK_PROMPT - cache.get_seq_length())
            block = self(tokens[CHECK_PROMPT : CHECK_PROMPT + count], cache, CHECK_PROMPT).logits
            differ += [(torch.equal(block[row], one_row[row]), f"row {row} of a {count}-token block")
                       for row in range(count)]
        cache.crop(CHECK_PROMPT - cache.get_seq_length())
        ids = [tokens[CHECK_PROMPT], tokens[CHECK_PROMPT + 1], 7, tokens[CHECK_PROMPT + 2]]  # node 2's sibling skipped
        block = self(ids, cache, CHECK_PROMPT, tree=[-1, -1, 0]).logits
        differ += [(torch.equal(block[row], one_row[index]), f"tree node {row}") for row, index in ((0, 0), (1, 1),
                                                                                                     (3, 2))]
        self._cache = None
        for same, where in differ:
            if not same:
                return f"{where} differs from a one-row forward"
        return None
