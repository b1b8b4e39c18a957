"""What a GGUF's in-place cache keeps beside its blocks so that later loads need no transformers: the config, the
generation config's token ids and the rotary tables, in `stored.json`; the tokenizer files are beside it
(native_tokenizer.py reads them).

The first load of a file (the cache being made) builds these: for llama, qwen2 and qwen3 files with a byte-level
vocabulary without transformers (native_side_files.py: the same values), for the rest with transformers, the
config class from the metadata (gguf_config.py), the family's rotary embedding module (its `inv_freq` and
scaling), the tokenizer by transformers' GGUF converter. `write_stored` keeps their values; every load, the first
included, then reads them back (`StoredConfig`, `StoredRotary`, `StoredGeneration`), so a model is built from
the same numbers whether its cache was made now or earlier. JSON keeps every value exactly (a float32 table is
written as the doubles it converts to, read back and converted to the same float32). Importing transformers costs
a second or more of start-up (issue 45); this module imports torch only.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ...files import read_json_bounded

STORED_FILE = "stored.json"
STORED_FORMAT = 1


class StoredConfig:
    """A model config's values as attributes (what transformers' config object held: its `to_dict()`), with its
    class's attribute aliases (`attribute_map`); read only."""

    def __init__(self, values: dict[str, Any], class_name: str, aliases: dict[str, str]):
        self.__dict__.update(values)
        self._class_name, self._aliases = class_name, dict(aliases)

    def __getattr__(self, name: str) -> Any:  # only for names not set: an alias of the class
        aliases = self.__dict__.get("_aliases", {})
        if name in aliases:
            return getattr(self, aliases[name])
        raise AttributeError(f"{self.__dict__.get('_class_name', 'StoredConfig')} has no attribute {name!r}")

    @property
    def name_or_path(self) -> str:
        return str(self.__dict__.get("_name_or_path", ""))

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key not in ("_class_name", "_aliases")}

    def transformers_class(self) -> Any:
        """The transformers config class it was stored from (for what transformers builds from its values)."""
        import transformers

        found = transformers.CONFIG_MAPPING[self.model_type]
        if found.__name__ != self._class_name:  # pragma: no cover - a transformers that renamed a class
            found = getattr(transformers, self._class_name)
        return found

    def __repr__(self) -> str:
        return f"{self._class_name}(stored) {json.dumps(self.to_dict(), sort_keys=True, default=str)}"


def config_class(config: Any) -> Any:
    """The transformers class of a config, a StoredConfig's included (distill builds students from it)."""
    return config.transformers_class() if isinstance(config, StoredConfig) else type(config)


class StoredGeneration:
    """The generation config's token ids (what the in-place model's GenerationConfig held)."""

    def __init__(self, bos_token_id: Any, eos_token_id: Any, pad_token_id: Any):
        self.bos_token_id, self.eos_token_id, self.pad_token_id = bos_token_id, eos_token_id, pad_token_id

    def transformers_config(self) -> Any:
        """transformers' GenerationConfig of these ids (what the in-place model held before; a student keeps it)."""
        from transformers import GenerationConfig

        return GenerationConfig(bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
                                pad_token_id=self.pad_token_id)


class StoredRotary(torch.nn.Module):
    """A family's rotary embedding module as its tables and settings (inv_freq and its per-layer-kind variants as
    buffers; rope_type, attention_scaling and the rest as attributes): what native.py reads of it."""

    def __init__(self, buffers: dict[str, torch.Tensor], attributes: dict[str, Any]):
        super().__init__()
        for name, value in buffers.items():
            self.register_buffer(name, value, persistent=False)
        for name, value in attributes.items():
            setattr(self, name, value)


class SiLU(torch.nn.SiLU):
    """The MLP's SiLU gate (transformers' ACT2FN["silu"] computes F.silu too)."""


class GeluTanh(torch.nn.Module):
    """GeLU with the tanh approximation, as transformers' ACT2FN["gelu_pytorch_tanh"]: F.gelu(approximate="tanh")
    held as `act` (native_support.activation_of reads it)."""

    def __init__(self) -> None:
        super().__init__()
        self.act = functools.partial(F.gelu, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


ACTIVATIONS = {"silu": SiLU, "gelu_pytorch_tanh": GeluTanh}


def default_rotary(values: dict[str, Any]) -> StoredRotary:
    """The rotary module transformers builds for a config of rope_type "default" (llama, qwen2, qwen3 without
    scaling), from the config's values: inv_freq = 1 / theta^(2i / head size) in float32 by the same torch
    operations, so the same bits (tests/specdec_cli/target_model/test_native_first_load.py); attention scaling 1."""
    theta = values["rope_parameters"]["rope_theta"]
    dim = values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))  # [dim / 2]
    length = values["max_position_embeddings"]
    return StoredRotary({"inv_freq": inv_freq, "original_inv_freq": inv_freq.clone()},
                        {"max_seq_len_cached": length, "original_max_seq_len": length, "rope_type": "default",
                         "attention_scaling": 1.0})


def write_stored(folder: Path, config: Any, rotary: torch.nn.Module) -> None:
    """Keep `config` (a transformers config, or a StoredConfig of one) and `rotary` (its rotary module) in
    folder/stored.json."""
    buffers = {name: {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                      "values": value.detach().cpu().reshape(-1).tolist()}
               for name, value in rotary.named_buffers(recurse=False)}
    attributes = {name: value for name, value in vars(rotary).items()
                  if not name.startswith("_") and name not in ("training", "config")
                  and isinstance(value, (bool, int, float, str, list, dict, type(None)))}
    document = {
        "format": STORED_FORMAT,
        "config": {"class": config._class_name if isinstance(config, StoredConfig) else type(config).__name__,
                   "values": config.to_dict(),
                   "aliases": config._aliases if isinstance(config, StoredConfig)
                   else dict(getattr(config, "attribute_map", {}) or {})},
        "generation": {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                       "pad_token_id": getattr(config, "pad_token_id", None)},
        "rotary": {"buffers": buffers, "attributes": attributes},
    }
    (folder / STORED_FILE).write_text(json.dumps(document), encoding="utf-8")


@functools.lru_cache(maxsize=4)
def _document(path: str, size: int, mtime_ns: int) -> dict[str, Any]:
    document = read_json_bounded(path)
    if not isinstance(document, dict) or document.get("format") != STORED_FORMAT:
        raise ValueError("another format")
    return document


def read_document(folder: Path) -> Optional[dict[str, Any]]:
    """folder/stored.json's document, None when it is missing or unreadable (the cache is then made again)."""
    path = folder / STORED_FILE
    try:
        stat = path.stat()
        return _document(str(path), stat.st_size, stat.st_mtime_ns)
    except (OSError, ValueError):
        return None


def stored_config(folder: Path) -> Optional[StoredConfig]:
    document = read_document(folder)
    if document is None:
        return None
    config = document["config"]
    values = dict(config["values"])
    if isinstance(values.get("id2label"), dict):  # JSON keeps keys as strings; the config's are ints
        values["id2label"] = {int(key): label for key, label in values["id2label"].items()}
    return StoredConfig(values, config["class"], config["aliases"])


def stored_generation(folder: Path) -> StoredGeneration:
    document = read_document(folder)
    if document is None:  # pragma: no cover - proved with the cache
        raise ValueError(f"{folder / STORED_FILE} cannot be read")
    return StoredGeneration(**document["generation"])


def stored_rotary(folder: Path) -> StoredRotary:
    document = read_document(folder)
    if document is None:  # pragma: no cover - proved with the cache
        raise ValueError(f"{folder / STORED_FILE} cannot be read")
    rotary = document["rotary"]
    buffers = {name: torch.tensor(item["values"], dtype=getattr(torch, item["dtype"])).reshape(item["shape"])
               for name, item in rotary["buffers"].items()}
    return StoredRotary(buffers, rotary["attributes"])
