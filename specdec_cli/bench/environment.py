"""Where a bench ran: the machine, the software, the model, and the verify-cost curve the engine planned with.

Reads the engine's curve; never measures anything itself.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from .. import __version__
from ..machine import cpu_model, usable_cores


def host_environment(started: Optional[datetime] = None) -> dict:
    """The machine and the Python a bench ran on, whatever engine ran it."""
    return {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "specdec": __version__,
        "date": (started or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
    }


def environment(model_name: str, device: str, dtype: Any, started: Optional[datetime] = None) -> dict:
    import torch

    gpu = None
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.cuda.current_device())
        if torch.cuda.device_count() > 1:
            gpu = f"{gpu} (x{torch.cuda.device_count()})"
    from .. import kernels
    from ..target_model.native.kv_cache import native_cache_dtype

    return {
        **host_environment(started),
        "torch_threads": torch.get_num_threads(),
        "kernel_threads": kernels.threads() if kernels.available() else None,  # specdec's C kernels (block weights)
        "kernel_path": kernels.isa() if kernels.available() else None,  # their instruction set: avx512vnni, ...
        "kv_cache": str(native_cache_dtype()).replace("torch.", ""),  # the native decoder's (--kv-cache)
        "gpu": gpu,
        "torch": torch.__version__,
        "transformers": _installed_version("transformers"),  # (not imported: the native path runs without it)
        "model": model_name,
        "dtype": str(dtype).replace("torch.", ""),
        "device": str(device),
    }


def _installed_version(package: str) -> Optional[str]:
    """The installed package's version, read from its metadata (the package is not imported)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def model_name_of(model: Any) -> str:
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return Path(name).name if name else type(model).__name__


def model_dtype(model: Any) -> Any:
    return getattr(model, "dtype", None) or next(model.parameters()).dtype


def cost_curve_table(engine: Any) -> Optional[dict]:
    """The engine's verify-cost curve as {"origin", "rows", "ms"}, or None when it has none (plain decoding
    only: nothing was planned, so nothing was measured)."""
    planner = engine.planner
    if not planner.has_curve:
        return None
    curve = planner.curve
    table = curve.seconds
    return {"origin": curve.origin, "rows": list(table), "ms": [round(seconds * 1000, 3) for seconds in table.values()]}
