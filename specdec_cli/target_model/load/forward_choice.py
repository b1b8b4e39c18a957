"""The verifying forward chosen once per loaded target: what the engine calls (verify/forward.VerifyForward).

`choose_forward(model, exact, load)`:
- the device engine (device/forward.DeviceForward), exact by construction at a fixed padded row count, where the
  load settings ask for it (`--decoder device`) or, by default, on cuda, for the families it computes;
- else the CPU path's forward (verify/exact_setup.model_forward): the native decoder on block weights and where
  exactness is on, transformers' modules otherwise.

`--decoder device` on a model the device engine cannot compute is a one-line error. This file only chooses; the
forwards compute.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...errors import SpecdecError
from ..device.family import unsupported as device_unsupported
from ..placement import pick_device, pick_dtype
from ..verify.exact_setup import model_forward
from ..verify.forward import VerifyForward


def choose_forward(model: Any, exact: Optional[bool] = None, load: Any = None) -> VerifyForward:
    """The forward that verifies on `model` (see the module docstring); `load` a LoadSettings or None (the CPU
    path), `exact` None: exactness by default (verify/exact_setup.exact_by_default)."""
    device_forward = _device_forward(model, load)
    return device_forward if device_forward is not None else model_forward(model, exact)


def _device_forward(model: Any, load: Any) -> Optional[VerifyForward]:
    if load is None:
        return None
    device = pick_device(load.device)
    if not (load.decoder == "device" or (load.decoder == "auto" and device == "cuda")):
        return None
    reason = device_unsupported(model)
    if reason is not None:
        if load.decoder == "device":
            raise SpecdecError(f"--decoder device: {reason}", setting="decoder")
        return None
    from ..device.forward import DeviceForward  # (torch's compile machinery: only when used)

    dtype = pick_dtype(load.dtype, device) if load.dtype != "auto" or device != "cpu" else torch.float32
    return DeviceForward(model, device, dtype)
