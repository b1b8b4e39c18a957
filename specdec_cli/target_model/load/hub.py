"""Target ids on the Hugging Face hub: where to load one from (the hub, or its copy in the local cache when the hub
cannot be reached), and a repo without safetensors weights refused before transformers sees it.

Nothing here changes the process's environment; HF_HUB_OFFLINE, HF_HOME and HF_ENDPOINT are read as the user
set them. Downloading and loading are transformers' (models.py calls it).
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import SpecdecError

HUB_PROBE_SECONDS = 3.0
SAFETENSORS_NAMES = ("model.safetensors", "model.safetensors.index.json")  # what transformers loads, whole or sharded


def check_hub(repo_id: str) -> str:
    """Where to load a hub id from: the id itself when the hub answers (and the repo holds safetensors weights),
    else the directory of its copy in the local Hugging Face cache, so that nothing asks the hub for a minute of
    retries; else one line at once. With HF_HUB_OFFLINE set, the id, which transformers finds in the cache itself.
    The process's environment is left as it is."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return repo_id
    cached_config = try_to_load_from_cache(repo_id, "config.json")
    cached = isinstance(cached_config, str)
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        if not cached:
            raise SpecdecError(f"{repo_id}: not a local file or directory, and not in the Hugging Face cache "
                               f"(HF_HUB_OFFLINE is set)", setting="target")
        return repo_id
    if hub_reachable():
        refuse_pickled_hub_weights(repo_id)
        return repo_id
    if cached:  # the cached copy's snapshot: a model directory like any other
        return str(Path(str(cached_config)).parent)
    raise SpecdecError(f"{repo_id}: not a local file or directory, not in the Hugging Face cache "
                       f"({os.environ.get('HF_HOME') or '~/.cache/huggingface'}), and the hub cannot be reached",
                       setting="target")


def refuse_pickled_hub_weights(repo_id: str) -> None:
    """A hub repo without safetensors weights is refused before transformers sees it: it would otherwise ask the
    hub's conversion bot to convert the pickle (a pull request on someone else's repo), or load nothing. Anything
    the question itself runs into (a private repo, no such repo) is left to transformers to say."""
    try:
        from huggingface_hub import file_exists

        if any(file_exists(repo_id, name) for name in SAFETENSORS_NAMES):
            return
    except Exception:  # noqa: BLE001 - the hub's errors are many; transformers reports them with the load
        return
    raise SpecdecError(_NO_SAFETENSORS.format(repo=repo_id))


_NO_SAFETENSORS = ("{repo}: the repo has no safetensors weights (a pickle, pytorch_model.bin, is never loaded: "
                   "unpickling can run code); download it, convert it to safetensors where you trust it "
                   "(AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR)), and give the directory")


def hub_reachable() -> bool:
    """Whether the Hugging Face endpoint accepts a TCP connection within a few seconds."""
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=HUB_PROBE_SECONDS):
            return True
    except OSError:
        return False


