"""A GGUF file opened and checked once per process (gguf_file.py's header, gguf_layout.py's tensors), and what
follows from the checks: whether the native decoder computes it in place, or which dtype transformers converts it
to. Nothing is loaded or cached here; models.py and converted.py both ask it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .. import families


@dataclass(frozen=True)
class CheckedGGUF:
    """A GGUF file whose header and tensors passed the checks (gguf_file.py, gguf_layout.py)."""

    gguf: Any  # gguf_file.GGUFFile (mapped)
    config: Any  # its transformers config (a StoredConfig of it where the file's in-place cache holds one: stored.py),
    # None for a family transformers has no config for
    native_reason: Optional[str]  # why the native decoder cannot compute it in place (None: it can)


_checked: dict[str, CheckedGGUF] = {}  # by gguf_file.file_identity


def checked_gguf(path: Path) -> CheckedGGUF:
    """Open and check a GGUF once per process and file version: the header, the hyperparameters against its tensor
    table (before any config is made from them), and for a family the native decoder computes, every tensor with
    the shape its metadata implies and every vector finite (SpecdecError naming the first fault)."""
    from ..gguf.gguf_config import hf_config
    from ..gguf.gguf_file import file_identity, open_gguf
    from ..gguf.gguf_layout import check_metadata, check_tensors, native_reason

    key = file_identity(path)
    if key in _checked:
        return _checked[key]
    gguf = open_gguf(path)
    check_metadata(gguf)  # before any config: transformers' configs build per-layer lists
    native = families.is_native_architecture(gguf.architecture)
    config = (_stored_config(gguf) or _config_without_transformers(gguf)) if native else None
    if config is None and (native or _transformers_has_config(gguf.architecture)):
        config = hf_config(gguf)
    reason = native_reason(gguf, config)
    if reason is None:
        check_vectors(gguf, check_tensors(gguf, config))
    _checked.clear()  # one file at a time: its mapping is released with it
    _checked[key] = CheckedGGUF(gguf, config, reason)
    return _checked[key]


def _stored_config(gguf: Any) -> Optional[Any]:
    """The config the file's in-place cache stored when the file was first loaded (stored.py), where that cache is
    the file's and intact (gguf_cache.cache_fault); else None. Read in milliseconds, without transformers."""
    from .gguf_cache import cache_fault, cache_folder
    from .stored import stored_config

    folder = cache_folder(gguf.path)
    return stored_config(folder) if cache_fault(folder, gguf) is None else None


def _config_without_transformers(gguf: Any) -> Optional[Any]:
    """The config of a llama, qwen2 or qwen3 file as transformers would build it, built from the metadata without
    importing transformers (gguf_config.config_without_transformers), as a StoredConfig; None for other files."""
    from ..gguf.gguf_config import config_without_transformers
    from .stored import StoredConfig

    made = config_without_transformers(gguf)
    return None if made is None else StoredConfig(made[1], made[0], {})


def transformers_config(checked: CheckedGGUF) -> Any:
    """The file's transformers config (built from the metadata where `checked` holds the stored one), for what
    transformers builds from it (a conversion)."""
    from ..gguf.gguf_config import hf_config
    from .stored import StoredConfig

    return hf_config(checked.gguf) if isinstance(checked.config, StoredConfig) else checked.config


def check_vectors(gguf: Any, expected: list) -> None:
    """The norms, biases and rope factors (kilobytes: every vector of the 8B shape is read in milliseconds) hold
    finite numbers: a NaN norm passes every other check and makes every answer garbage (token 0 repeated). Refused
    before anything is cached or computed, whichever way the file is then loaded (in place, or converted)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from ...errors import SpecdecError

    for item in expected:
        if item.matrix or item.module == "model.embed_tokens":
            continue
        info = gguf.tensors[item.gguf_name]
        values = dequantize(gguf.raw(item.gguf_name), GGMLQuantizationType[info.type_name])
        finite = np.isfinite(values)
        if not finite.all():
            raise SpecdecError(f"{gguf.path}: tensor {item.gguf_name} holds {int(finite.size - finite.sum()):,} NaN "
                               f"or infinite values of {finite.size:,}")


def _transformers_has_config(architecture: str) -> bool:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return architecture in GGUF_CONFIG_MAPPING


def conversion_dtype(checked: CheckedGGUF) -> str:
    """The dtype a GGUF is converted to for transformers: float32 for a family the native decoder computes (asked
    for dense, or for vLLM), bfloat16 for the others, which only run that way (half the memory)."""
    return "float32" if checked.native_reason is None else "bfloat16"
