"""The device engine: a torch decoder exact by construction, for a GPU (and testable on the CPU).

specdec's native decoder (target_model/native/native.py) is row-invariant because its CPU kernels compute every row
alone. On a GPU, and with torch's own GEMMs on a CPU, a row's result depends on how many rows share the call
(docs/algorithms.md section 12). This package removes that dependence by construction instead of by kernel:

- every forward that verifies, and plain decoding too, runs at ONE fixed padded row count (`ROWS`), so the
  shapes of every GEMM, of the attention and of the cache are the same at every step (a row's result never
  depends on how many rows are real);
- attention reads each query row's keys from a static KV cache allocated once per forward object (`StaticCache`)
  in two regions split by the row's own position (the committed keys under a mask over every slot, its last few
  positions gathered in position order), so the split of the keys never changes with the number of query rows
  or the shape of a tree;
- the weights are put on the device once (`DeviceWeights`): a GGUF's blocks kept at the file's bits and
  multiplied by a Triton kernel (on cuda), or dequantised there into the compute dtype, chunk by chunk, never a
  float32 copy of the model in host memory.

Being fixed-shape, the step can be captured once (`capture.StepGraph`: a CUDA graph on cuda, eager on the CPU) and
its layer compiled (on cuda: fewer, fused kernels; its layers write nothing, the step stores their keys after
them), prefill runs outside it, and a step reads one thing back to the host: the tokens the engine accepts.

Files, one concept each: `family.py` (what the decoder reads off a loaded target, and `unsupported`),
`weights.py` (weights on the device: a GGUF matrix at the file's bits is specdec_cli/kernels/triton_layout.py's,
multiplied by kernels/triton_gemm.py), `cache.py` (the static cache and its roll-back), `inputs.py` (a step's
inputs staged on the host and copied in one transfer), `decoder.py` (the fixed-shape computation), `capture.py`
(the step captured or eager), `forward.py` (`DeviceForward`, the engine's VerifyForward). Importing this package
loads nothing heavy: torch is imported by the modules themselves.
"""

from __future__ import annotations

ROWS = 16  # every step (verification and plain decoding) runs at this many padded rows
PREFILL_ROWS = 128  # a prompt is computed in chunks of up to this many rows, outside the captured step
CONTEXT = {"cuda": 4096, "cpu": 1024}  # static cache slots by device type (capped by the model's context)
DECODERS = ("auto", "device")  # --decoder: auto = the device engine on cuda, specdec's usual forwards elsewhere
