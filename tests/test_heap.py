"""heap.py: what a stage freed goes back to the system."""

from __future__ import annotations

import ctypes
import os

import pytest

from specdec_cli.heap import return_free_memory


def _resident_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status") or
                    getattr(ctypes.CDLL(None), "malloc_trim", None) is None, reason="glibc on Linux")
def test_memory_a_stage_freed_goes_back_to_the_system():
    """Small blocks freed below one still in use stay in the C heap (the heap cannot shrink past it); returned,
    their pages leave the process."""
    blocks = [bytearray(60_000) for _ in range(2_000)]  # ~120 MB in blocks the C heap holds, each touched
    kept = blocks[-1]
    del blocks
    before = _resident_mb()
    return_free_memory()
    assert _resident_mb() < before - 60
    assert len(kept) == 60_000
