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


def _status_kb(*keys: str) -> Optional[dict[str, int]]:
    """Fields of /proc/self/status in bytes (Linux), or None."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in keys and value.strip().endswith("kB"):
                    found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    return found if len(found) == len(keys) else None


def resident_memory() -> Optional[tuple[int, int]]:
    """(resident bytes, of which pages of mapped files) of this process now, or None off Linux. Mapped file pages
    (a GGUF, a blocks cache) are shared with the page cache and dropped under pressure; the rest is anonymous."""
    found = _status_kb("VmRSS", "RssFile")
    return None if found is None else (found["VmRSS"], found["RssFile"])


def peak_resident_memory() -> Optional[int]:
    """The most bytes this process has held resident (VmHWM), or None off Linux."""
    found = _status_kb("VmHWM")
    return None if found is None else found["VmHWM"]
