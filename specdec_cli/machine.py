"""What machine this is, in the words a benchmark report and a cache key need: the CPU model and the cores.

Reads /proc/cpuinfo and the scheduler's affinity; never imports torch. It does not measure speed
(decoding/planner.py does that).
"""

from __future__ import annotations

import os
import platform
from typing import Optional


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC 7B13", "Intel(R) Xeon(R) ..."), or the best guess the OS gives."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> Optional[int]:
    """Cores this process may run on (its CPU affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()
