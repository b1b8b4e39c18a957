"""GGUF files of families transformers' GGUF loader does not read (gemma, smollm3), loaded as transformers models.

transformers 5.24 reads a GGUF's config and tensors only for the architectures it maps (llama, mistral, qwen2,
qwen3, phi3, gemma2, gemma3, ...); a Gemma (1) or SmolLM3 file stops at "architecture not supported". This file
builds the Hugging Face config from the file's metadata (`config_of`), creates the model from it and fills its
weights with the file's tensors dequantised (`load`), undoing what llama.cpp's converter did to them:

- gemma: RMSNorm weights are stored as 1 + weight (Gemma's norms multiply by 1 + weight); no rotary base is
  written (Gemma's 10000 holds), the head size is `attention.key_length`;
- smollm3: a llama-shaped file (q/k rows interleaved per head as for llama, `gguf_decode.permuted_rows`) whose layers
  without rotary embedding are not in the metadata: llama.cpp fixes them at every 4th layer, SmolLM3's own
  default (`no_rope_layer_interval` 4).

The tokenizer comes from transformers' own GGUF tokenizer reader, which does not depend on the architecture.
`handles(path)` says whether a file needs this (a family whose row in families.py says so, and transformers does
not read it itself); models.py then calls `load` instead of transformers' GGUF loader. The file is read through
gguf_file.py (its parsed metadata and mapped tensors); what the converter did is the family table's. The block
weights are taken from the file afterwards as for any GGUF (converted_blocks.gguf_blocks). Nothing here runs a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import families
from .gguf_file import open_gguf


def architecture(path: Path) -> str:
    """The file's `general.architecture` ('' when it has none)."""
    return open_gguf(path).architecture


def transformers_reads(arch: str) -> bool:
    """Whether transformers' own GGUF loader reads files of this architecture."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    readers = set(GGUF_SUPPORTED_ARCHITECTURES)
    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS

        readers |= set(GGUF_CONFIG_ARCHS)
    except ImportError:  # pragma: no cover - older transformers
        pass
    return arch in readers


def reads(arch: str) -> bool:
    """Whether files of this architecture are read here: a family of the table's with its own GGUF loader
    (families.Family.own_gguf_loader) that transformers' loader does not read."""
    return arch in families.own_loader_architectures() and not transformers_reads(arch)


def handles(path: Path) -> bool:
    """Whether `load` is the way to read this file (an architecture here that transformers does not read)."""
    return reads(architecture(path))


def config_of(values: dict[str, Any], tensor_names: set[str]) -> Any:
    """The Hugging Face config a gemma or smollm3 GGUF describes, from its metadata (gguf_file.GGUFFile.metadata;
    the token list or its length), ValueError for a missing key."""
    import transformers

    arch = values["general.architecture"]

    def key(name: str, default: Any = None) -> Any:
        value = values.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"the file has no {arch}.{name}")
        return value

    heads = int(key("attention.head_count"))
    settings: dict[str, Any] = dict(
        vocab_size=int(_count(values.get("tokenizer.ggml.tokens")) or key("vocab_size")),
        hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("feed_forward_length")),
        num_hidden_layers=int(key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,  # llama.cpp writes the head only when untied
        bos_token_id=values.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=values.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=values.get("tokenizer.ggml.padding_token_id"),
    )
    if arch == "gemma":
        theta = float(key("rope.freq_base", 10000.0))
        head_dim = int(key("attention.key_length", settings["hidden_size"] // heads))
        return transformers.GemmaConfig(**settings, head_dim=head_dim, hidden_act="gelu_pytorch_tanh",
                                        rope_parameters={"rope_type": "default", "rope_theta": theta})
    if arch == "smollm3":
        theta = float(key("rope.freq_base", 10000.0))
        return transformers.SmolLM3Config(**settings, no_rope_layer_interval=4, use_sliding_window=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": theta})
    raise ValueError(f"no config mapping for GGUF architecture {arch!r}")


def _count(tokens: Any) -> Any:
    return len(tokens) if isinstance(tokens, list) else tokens


def load(path: Path) -> tuple[Any, Any]:
    """(model in float32 and eval mode, tokenizer) from a gemma or smollm3 GGUF. Raises ValueError (or gguf's and
    transformers' own errors) for a file that does not hold what its metadata says."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from .gguf_decode import permuted_rows

    file = open_gguf(path)
    tensors = file.tensors
    config = config_of(file.metadata, set(tensors))
    arch_name = file.architecture
    family = families.of_architecture(arch_name)
    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch_name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    name_map = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    state = {}
    for name, parameter in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        base, _, suffix = name.rpartition(".")
        found = name_map.get_name(base)
        if found is None or f"{found}.{suffix}" not in tensors:
            raise ValueError(f"the file has no tensor for {name}")
        info = tensors[f"{found}.{suffix}"]
        data = gguf.quants.dequantize(file.raw(info.name), gguf.GGMLQuantizationType[info.type_name])
        data = data.astype(np.float32).reshape(tuple(parameter.shape))
        if family is not None and family.norm_plus_one and base.endswith("norm"):
            data = data - 1  # stored as 1 + weight: transformers' norm adds the one back
        if family is not None and family.permuted_qk and found.endswith(("attn_q", "attn_k")):
            heads = config.num_attention_heads if found.endswith("attn_q") else config.num_key_value_heads
            data = data[permuted_rows(data.shape[0], heads)]  # llama.cpp's interleaved rotary halves, undone
        state[name] = torch.from_numpy(np.ascontiguousarray(data))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not (name == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"the file's tensors do not fill the model ({(missing or unexpected)[0]})")
    if config.tie_word_embeddings:
        model.tie_weights()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer
