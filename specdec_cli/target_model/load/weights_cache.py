"""The cache of converted weights: a model's planned blocks (converted_blocks.plan_blocks), once per model and mode.

One safetensors file per model identity and `--weights` mode under $SPECDEC_HOME/weights (`cache_file`), holding
each block layer's packed records and, in the metadata, its kind, shape and origin; `CACHE_FORMAT` versions the
layout and the conversion rules. `load_cached` returns None for anything absent, foreign or damaged (then the
model is converted again); `save_cached` writes atomically and gives up quietly on a read-only home. This file
stores and reads blocks; it does not make them (quant.py, gguf_decode.py) nor install them in a model. GGUFs
computed in place have their own cache (gguf_blocks.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

import torch

from ... import kernels
from ...errors import SpecdecError
from ...files import write_atomic
from ..native.block_weights import BlockWeights

CACHE_FORMAT = 3  # bump when the cached file's layout or a conversion rule changes (3: packed kinds)


def cache_file(home: Path, identity: str, mode: str) -> Path:
    digest = hashlib.sha256(f"{identity}|{mode}|{CACHE_FORMAT}".encode()).hexdigest()[:16]
    return home / "weights" / f"{mode}-{digest}.safetensors"


def load_cached(path: Path) -> Optional[dict[str, BlockWeights]]:
    """The planned blocks stored at `path`, or None when absent, foreign or unreadable (then converted again)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            if meta.get("format") != str(CACHE_FORMAT) or meta.get("kind") != "specdec-blocks":
                return None
            layers = json.loads(meta["layers"])
            planned = {}
            for name, info in layers.items():
                records = handle.get_tensor(f"{name}.records")
                kind, out_features, in_features = int(info["kind"]), int(info["out"]), int(info["in"])
                if tuple(records.shape) != (kernels.groups(out_features), kernels.record_bytes(kind, in_features)):
                    return None
                planned[name] = BlockWeights(kind, records, out_features, in_features, str(info["origin"]))
            return planned
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError):
        return None


def save_cached(path: Path, planned: dict[str, BlockWeights]) -> None:
    """Write the planned blocks atomically (a read-only home only costs a conversion next time)."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    layers = {}
    for name, weights in planned.items():
        tensors[f"{name}.records"] = weights.records.contiguous()
        layers[name] = {"kind": weights.kind, "out": weights.shape[0], "in": weights.shape[1], "origin": weights.origin}
    meta = {"format": str(CACHE_FORMAT), "kind": "specdec-blocks", "layers": json.dumps(layers)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, save(tensors, metadata=meta))
    except (OSError, SpecdecError):
        pass
