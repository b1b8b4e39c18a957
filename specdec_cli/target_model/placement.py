"""Where the target computes: the device and dtype a setting names here, and the CPU threads of torch and of
specdec's kernels (`--threads`; block weights give the kernels torch's threads, dense weights give them back).

Policy only: nothing here loads a model (models.py) or runs a kernel.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecdecError


def pick_device(device: str) -> str:
    """The device `device` (one of load_settings.DEVICES) names here: `auto` is cuda, mps or cpu, whichever is."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecdecError("device cuda: no CUDA device is available", setting="device")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SpecdecError("device mps: no MPS device is available", setting="device")
    return device


def pick_dtype(dtype: str, device: str) -> Any:
    """The torch dtype `dtype` (one of load_settings.DTYPES) names on `device`; `auto` before any timing: float32
    on a CPU (load_target may then time bfloat16), bfloat16 or float16 on a GPU."""
    import torch

    if dtype == "auto":
        if device == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device == "mps":
            return torch.float16
        return torch.float32
    return getattr(torch, dtype)


def use_block_threads() -> None:
    """Block weights: specdec's kernels take torch's threads and torch keeps one (two thread pools spinning on the
    same cores slow a step down: docs/measurements.md). `--threads N` before loading sets how many."""
    import torch

    from .. import kernels

    wanted = max(torch.get_num_threads(), kernels.threads())
    kernels.set_threads(wanted)
    torch.set_num_threads(1)


def dense_threads() -> None:
    """Dense weights after the kernels took the threads (use_block_threads): torch gets them back."""
    import torch

    from .. import kernels

    if kernels.available():
        torch.set_num_threads(max(torch.get_num_threads(), kernels.threads()))


THREADS_FLAG_LIMIT = 1024  # the most --threads takes: far beyond any CPU's cores, far below what makes
# thread creation fail (not kernels.THREADS_FLAG_LIMIT, the pool's own limit: the kernels get min(threads, 64))


def set_threads(threads: int) -> None:
    """Pin the CPU threads (`--threads`) of torch and of specdec's kernels: on a CPU shared with other jobs, fewer
    threads than cores avoid the threads thrashing each other."""
    if not 1 <= threads <= THREADS_FLAG_LIMIT:  # tens of thousands of OpenMP threads exhaust the process and crash it
        raise SpecdecError(f"threads must be between 1 and {THREADS_FLAG_LIMIT:,}, got {threads:,}", setting="threads")
    import torch

    from .. import kernels

    torch.set_num_threads(threads)
    if kernels.available():
        kernels.set_threads(threads)
