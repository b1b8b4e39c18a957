"""The side files of a GGUF's in-place cache written without transformers, where specdec builds the file's config
and tokenizer itself: llama, qwen2 and qwen3 files with a byte-level BPE tokenizer (the default model, Qwen2.5,
the synthetic shapes of benchmarks/write_gguf.py).

The cache keeps, beside its blocks (gguf_model.py): the tokenizer files, config.json, generation_config.json and
stored.json (the config's values and the rotary tables later loads read: stored.py). A first load used to make
them with transformers (its GGUF config and tokenizer converters, the family's rotary module), and importing it
cost 4-5 s of a first answer. Here each comes from the metadata: the config's values
(gguf_config.config_without_transformers), the tokenizer files (gguf_tokenizer.py) and the default rotary tables
(stored.default_rotary); config.json and generation_config.json are the values transformers' `save_pretrained`
writes (the settings that differ from a bare config's, keys sorted).
tests/specdec_cli/target_model/test_native_first_load.py compares every file, byte for byte, with what transformers
writes for the same GGUF. `write_native_side_files` returns False, writing nothing, for any other file; the caller
then asks transformers, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..gguf.gguf_config import BASE_SETTINGS, config_without_transformers
from ..gguf.gguf_file import GGUFFile
from ..gguf.gguf_tokenizer import tokenizer_files
from .stored import StoredConfig, default_rotary, write_stored


def write_native_side_files(gguf: GGUFFile, folder: Path) -> bool:
    """Write the side files into `folder` (see the module docstring), or return False having written nothing."""
    made = config_without_transformers(gguf)
    tokenizer = tokenizer_files(gguf.metadata) if made is not None else None
    if made is None or tokenizer is None:
        return False
    class_name, values = made
    tokenizer.write(folder)
    _write_json(folder / "config.json", _saved_settings(values))
    generation = {key: values.get(key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    _write_json(folder / "generation_config.json",
                {**{key: value for key, value in generation.items() if value is not None},
                 "transformers_version": values["transformers_version"]})
    write_stored(folder, StoredConfig(values, class_name, {}), default_rotary(values))
    return True


def _saved_settings(values: dict[str, Any]) -> dict[str, Any]:
    """What transformers' `save_pretrained` writes of a config: its values less those a bare config holds too."""
    return {key: value for key, value in values.items()
            if key != "_name_or_path" and not (key in BASE_SETTINGS and BASE_SETTINGS[key] == value)}


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
