"""The fixed-shape step, captured once and replayed (a CUDA graph on cuda), or run eagerly (the CPU).

A decoding step on a GPU at batch 1 launches hundreds of small kernels; launched one by one from Python, the
launches cost more than the kernels (the H100 measurement in issue 48: 0.08x the bandwidth bound). The device
decoder's step has the same shapes and the same buffers at every call (decoder.py), so on cuda it is captured
once as a CUDA graph (after a warm-up on a side stream, as capture requires) and every later step is one replay;
its outputs are the graph's static outputs, which the caller copies before the next step. Elsewhere, or with
capture off (`SPECDEC_DEVICE_CAPTURE=0`), the step runs eagerly: the same operations on the same shapes, so the
same numbers (a captured replay runs the kernels the warm-up ran). A capture that fails falls back to eager with a
warning. Prefill is not captured (its chunks are bigger, and run once per answer).
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


class StepGraph:
    """`step()` -> the outputs of `compute()`, from a captured graph where capture is on."""

    def __init__(self, compute: Callable[[], Outputs], device: torch.device):
        self.compute = compute
        self.enabled = capture_wanted(device)
        self.graph: Optional[Any] = None  # torch.cuda.CUDAGraph once captured
        self.outputs: Optional[Outputs] = None
        self.note = "captured (CUDA graph)" if self.enabled else "eager"

    def __call__(self) -> Outputs:
        if not self.enabled:
            return self.compute()
        if self.graph is None:
            try:
                self._capture()
            except Exception as error:  # pragma: no cover - needs a GPU
                self.enabled, self.graph = False, None
                self.note = f"eager (capture failed: {type(error).__name__}: {str(error).strip()[:100]})"
                warnings.warn(f"the device engine's step runs eagerly: {self.note}", stacklevel=2)
                return self.compute()
        assert self.graph is not None
        self.graph.replay()
        assert self.outputs is not None
        return self.outputs

    def _capture(self) -> None:  # pragma: no cover - needs a GPU
        """Warm up on a side stream (the same inputs: it writes the same cache slots the replay writes), then
        capture one step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.compute()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.outputs = self.compute()
        self.graph = graph
