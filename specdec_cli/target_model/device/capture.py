"""The fixed-shape step, its layers compiled, captured once and replayed (a CUDA graph on cuda), or run eagerly.

A decoding step on a GPU at batch 1 launches hundreds of small kernels; launched one by one from Python, the
launches cost more than the kernels (the H100 measurement in issue 48: 0.08x the bandwidth bound). The device
decoder's step has the same shapes and the same buffers at every call (decoder.py), so on cuda it is captured
once as a CUDA graph (after a warm-up on a side stream, as capture requires) and every later step is one replay;
its outputs are the graph's static outputs, which the caller copies before the next step. Elsewhere, or with
capture off (`SPECDEC_DEVICE_CAPTURE=0`), the step runs eagerly: the same operations on the same shapes, so the
same numbers (a captured replay runs the kernels the warm-up ran). A capture that fails falls back to eager with a
warning. Prefill is not captured (its chunks are bigger, and run once per answer).

A replayed graph still runs every kernel the step launches: about 70 a layer (norms, rotary embedding and the
attention's softmax are chains of small element-wise kernels), over 2,000 a step, each a few microseconds however
little it computes (an H200, 2026-11-28: 6.8 ms a step for a 135M model, 12.4 ms for an 8B one). So on cuda a
step's layer is compiled by torch.compile (decoder.py's `step_layer`: one layer's function, fixed shapes, compiled
once and run by every layer of its kind), which fuses each chain of element-wise work into one kernel; the step
mutates nothing inside it (the cache is written after the layers), so nothing is copied for the compiler's sake.
`SPECDEC_DEVICE_COMPILE=0` turns it off, `=1` turns it on elsewhere too (the CPU, where the tests run it).
Compiling changes no shape, so rows stay independent: a compiled step is exact against plain decoding on the
compiled step, as an eager one is against eager plain decoding. A compilation that fails falls back to the eager
layer with a warning.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional

import torch

Outputs = tuple[torch.Tensor, torch.Tensor]


def capture_wanted(device: torch.device) -> bool:
    """Capture on cuda unless SPECDEC_DEVICE_CAPTURE=0; never elsewhere."""
    return device.type == "cuda" and os.environ.get("SPECDEC_DEVICE_CAPTURE", "1").strip() != "0"


def compile_wanted(device: torch.device) -> bool:
    """Compile on cuda unless SPECDEC_DEVICE_COMPILE=0; elsewhere only with SPECDEC_DEVICE_COMPILE=1."""
    setting = os.environ.get("SPECDEC_DEVICE_COMPILE", "").strip()
    return setting == "1" if setting in ("0", "1") else device.type == "cuda"


class StepGraph:
    """`step()` -> the outputs of `compute()`, from a captured graph where capture is on. Where the step's layers are
    compiled, `uncompile` makes them eager again if compiling fails (at the first step)."""

    def __init__(self, compute: Callable[[], Outputs], device: torch.device,
                 uncompile: Optional[Callable[[], None]] = None):
        self.compute, self.uncompile = compute, uncompile
        self.enabled = capture_wanted(device)
        self.graph: Optional[Any] = None  # torch.cuda.CUDAGraph once captured
        self.outputs: Optional[Outputs] = None
        self.note = ("compiled, " if uncompile else "") + ("captured (CUDA graph)" if self.enabled else "eager")
        self.started = False  # the first step has compiled (or failed to) and captured (or failed to)

    def __call__(self) -> Outputs:
        if not self.started:
            self.started = True
            self._first()
        if not self.enabled:
            return self.compute()
        assert self.graph is not None
        self.graph.replay()
        assert self.outputs is not None
        return self.outputs

    def _first(self) -> None:
        """Compile (the first run does), then capture; each that fails falls back, with a warning."""
        if self.uncompile is not None:
            try:
                self._warm_up()
            except Exception as error:  # a compiler missing, or refusing the step
                self.uncompile()
                self.note = self.note.replace("compiled, ", "")
                self._warn("compiled", error)
        if self.enabled:
            try:
                self._capture()
            except Exception as error:  # pragma: no cover - needs a GPU
                self.enabled, self.graph = False, None
                self.note = self.note.replace("captured (CUDA graph)", "eager")
                self._warn("captured", error)

    def _warn(self, what: str, error: Exception) -> None:
        reason = f"{type(error).__name__}: {str(error).strip()[:100]}"
        self.note += f" (not {what}: {reason})"
        warnings.warn(f"the device engine's step is not {what}: {reason}", stacklevel=4)

    def _warm_up(self) -> None:
        """Run the step twice off the main stream, as capture requires (or, with nothing to capture, once)."""
        if not self.enabled:
            self.compute()
            return
        side = torch.cuda.Stream()  # pragma: no cover - needs a GPU
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.compute()
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self) -> None:  # pragma: no cover - needs a GPU
        """Warm up on a side stream (the same inputs: it writes the same cache slots the replay writes), then
        capture one step."""
        self._warm_up()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs = self.compute()
        self.graph = graph
