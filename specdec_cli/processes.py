"""Child processes specdec starts (llama-server, vLLM): stopping one politely, then firmly.

Starting them, and reading what they print, is their runners' own (bench/llama_server.py, vllm/runner.py).
"""

from __future__ import annotations

import subprocess


def stop_child(process: subprocess.Popen, grace_seconds: float) -> None:
    """SIGTERM a child that is still running; SIGKILL it if it has not exited within `grace_seconds`."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
