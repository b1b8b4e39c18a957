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

from typing import Any, Optional

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
    _add_token_settings(metadata, config)
    return config


def _add_token_settings(metadata: dict[str, Any], config: dict[str, Any]) -> None:
    """What transformers' loader takes from the tokenizer's metadata: the vocabulary's size from the token list
    where the architecture's keys do not say it, and the special tokens' ids."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and isinstance(tokens, list):
        config["vocab_size"] = len(tokens)
    for key, renamed in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                         ("unknown_token_id", "unk_token_id"), ("padding_token_id", "pad_token_id")):
        if f"tokenizer.ggml.{key}" in metadata:
            config[renamed] = metadata[f"tokenizer.ggml.{key}"]


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


# -- without transformers ------------------------------------------------------------------------------------------
# The config of the plainest families, built from the metadata without importing transformers (2-5 s of a first
# load, issue 45): the values `hf_config(gguf).to_dict()` holds, which
# tests/specdec_cli/target_model/test_native_first_load.py checks key by key against transformers for every family
# below. Other families, and a llama file of a Mistral, return None.

# transformers' key table (GGUF_CONFIG_MAPPING) for these architectures: GGUF key -> config attribute
_KEYS = {"context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
         "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size",
         "rope.freq_base": "rope_theta", "attention.head_count": "num_attention_heads",
         "attention.head_count_kv": "num_key_value_heads", "attention.layer_norm_rms_epsilon": "rms_norm_eps",
         "vocab_size": "vocab_size"}
# what every transformers config holds (PretrainedConfig's own settings)
BASE_SETTINGS: dict[str, Any] = {
    "architectures": None, "output_hidden_states": False, "output_attentions": False, "return_dict": True,
    "dtype": None, "chunk_size_feed_forward": 0, "is_encoder_decoder": False, "problem_type": None,
    "id2label": {0: "LABEL_0", 1: "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}}
_COMMON: dict[str, Any] = {"hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-06,
                           "use_cache": True, "tie_word_embeddings": False, "attention_dropout": 0.0,
                           "rope_theta": 10000.0}
# architecture -> (config class, the class's defaults for what the metadata may not say)
_CLASSES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {**_COMMON, "vocab_size": 32000, "max_position_embeddings": 2048, "pad_token_id": None,
                              "bos_token_id": 1, "eos_token_id": 2, "pretraining_tp": 1, "attention_bias": False,
                              "mlp_bias": False, "head_dim": None}),
    "qwen2": ("Qwen2Config", {**_COMMON, "vocab_size": 151936, "max_position_embeddings": 32768,
                              "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28,
                              "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}),
    "qwen3": ("Qwen3Config", {**_COMMON, "vocab_size": 151936, "max_position_embeddings": 32768, "head_dim": 128,
                              "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
                              "max_window_layers": 28, "pad_token_id": None, "bos_token_id": None,
                              "eos_token_id": None}),
}


def config_without_transformers(gguf: GGUFFile) -> Optional[tuple[str, dict[str, Any]]]:
    """(the config class's name, its `to_dict()` values) for a llama, qwen2 or qwen3 file, as `hf_config` would
    make them; None for another family or a value of a type transformers would have to judge."""
    import importlib.metadata

    metadata = gguf.metadata
    architecture = gguf.architecture
    name = metadata.get("general.name", "")
    if architecture not in _CLASSES or not isinstance(name, str) or "mistral" in name:
        return None
    class_name, defaults = _CLASSES[architecture]
    source: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in gguf.tensors}
    keys = dict(_KEYS, **({"rope.dimension_count": "head_dim"} if architecture == "llama" else {}))
    for key, renamed in keys.items():
        value = metadata.get(f"{architecture}.{key}")
        if value is not None:
            source[renamed] = value
    _add_token_settings(metadata, source)
    key_length = metadata.get(f"{architecture}.attention.key_length")
    if isinstance(key_length, int) and key_length > 0 and "head_dim" in defaults:
        source["head_dim"] = key_length
    floats, ints = ("rope_theta", "rms_norm_eps"), ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                     "num_key_value_heads", "intermediate_size", "vocab_size")
    if any(not isinstance(source.get(key, 1.0), float) for key in floats) or \
            any(type(source.get(key, 1)) is not int for key in ints):  # noqa: E721 - bool is not a count
        return None
    values = {**BASE_SETTINGS, **defaults, **source}
    values["num_key_value_heads"] = values.get("num_key_value_heads") or values["num_attention_heads"]
    values["rope_parameters"] = {"rope_theta": values.pop("rope_theta"), "rope_type": "default"}
    if architecture == "llama" and values["head_dim"] is None:
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    if "layer_types" not in values and "max_window_layers" in values:
        values["layer_types"] = ["full_attention"] * values["num_hidden_layers"]
    values["model_type"] = architecture
    if name:
        values["_model_name_or_path"] = name
    values["_name_or_path"] = name or gguf.path.stem
    values["transformers_version"] = importlib.metadata.version("transformers")
    return class_name, values
