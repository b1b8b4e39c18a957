"""The Hugging Face config a GGUF's metadata describes, read from the header alone (gguf_file.py), in milliseconds.

transformers builds the same config when given `gguf_file=`, but through a reader that decodes every metadata
field of the file (15 s for the default model's 49k-token vocabulary on a busy 2-core machine). This file applies
transformers' own key tables (`GGUF_CONFIG_MAPPING`, its per-family defaults and the renames its loader makes:
mistral files labelled llama, gemma3 as gemma3_text, the vocabulary's size from the token list, tied embeddings
when there is no `output.weight`) to the metadata gguf_file.py already parsed, so the result is the config class
transformers would build. Gemma (1) and SmolLM3, which transformers' loader does not read, take
gguf_families.config_of. A config is plain settings: no model is built here, and no tensor is read.
"""

from __future__ import annotations

from typing import Any

from ...errors import SpecdecError
from .gguf_file import GGUFFile


def config_dict(gguf: GGUFFile) -> dict[str, Any]:
    """transformers' config dict for the file (as `load_gguf_checkpoint(..., return_tensors=False)["config"]`)."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    metadata = gguf.metadata
    architecture = gguf.architecture
    name = str(metadata.get("general.name", "") or "")
    updated = "mistral" if "llama" in architecture and "mistral" in name else architecture
    if architecture not in GGUF_CONFIG_MAPPING and updated not in GGUF_CONFIG_MAPPING:
        raise SpecdecError(f"{gguf.path}: transformers has no config for GGUF architecture {architecture!r}")
    config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in gguf.tensors}
    defaults: dict[str, Any] = GGUF_CONFIG_DEFAULTS_MAPPING.get(updated, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture)
                                                                or {})
    for key in defaults:
        config.setdefault(key, defaults[key])
    mapping: dict[str, Any] = GGUF_CONFIG_MAPPING
    tables: dict[str, Any] = {"general": mapping.get("general", {}),
                              architecture: mapping.get(updated) or mapping[architecture]}
    for key, raw_value in metadata.items():
        prefix, _, rest = key.partition(".")
        renamed = tables.get(prefix, {}).get(rest, -1)
        if renamed in (-1, None):
            continue
        value: Any = raw_value
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, updated)
        config[renamed] = value
    config.setdefault("model_type", updated)
    if config["model_type"] == "gemma3":
        config["model_type"] = "gemma3_text"
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and isinstance(tokens, list):
        config["vocab_size"] = len(tokens)
    for key, renamed in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                         ("unknown_token_id", "unk_token_id"), ("padding_token_id", "pad_token_id")):
        if f"tokenizer.ggml.{key}" in metadata:
            config[renamed] = metadata[f"tokenizer.ggml.{key}"]
    return config


def hf_config(gguf: GGUFFile) -> Any:
    """The config object (LlamaConfig, Qwen2Config, ...) the file describes, with its head size taken from
    `attention.key_length` where the file says it (transformers' table leaves qwen3's at the class default)."""
    from transformers import CONFIG_MAPPING

    from . import gguf_families

    architecture = gguf.architecture
    if gguf_families.reads(architecture):
        values = dict(gguf.metadata)
        tokens = values.get("tokenizer.ggml.tokens")
        values["tokenizer.ggml.tokens"] = len(tokens) if isinstance(tokens, list) else tokens
        try:
            config = gguf_families.config_of(values, set(gguf.tensors))
        except ValueError as exc:
            raise SpecdecError(f"{gguf.path}: {exc}") from exc
    else:
        settings = config_dict(gguf)
        try:
            config = CONFIG_MAPPING[settings["model_type"]].from_dict(settings)
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecdecError(f"{gguf.path}: its metadata does not make a {settings.get('model_type')} config "
                               f"({type(exc).__name__}: {exc})") from exc
    key_length = gguf.metadata.get(f"{architecture}.attention.key_length")
    if isinstance(key_length, int) and key_length > 0 and hasattr(config, "head_dim"):
        config.head_dim = key_length
    config._name_or_path = str(gguf.metadata.get("general.name", "") or gguf.path.stem)
    return config
