"""GGUF files of families transformers' GGUF loader does not read (gemma, smollm3), loaded as transformers models.

transformers 5.24 reads a GGUF's config and tensors only for the architectures it maps (llama, mistral, qwen2,
qwen3, phi3, gemma2, gemma3, ...); a Gemma (1) or SmolLM3 file stops at "architecture not supported". This file
builds the Hugging Face config from the file's metadata (`config_of`), creates the model from it and fills its
weights with the file's tensors dequantised (`load`), undoing what llama.cpp's converter did to them:

- gemma: RMSNorm weights are stored as 1 + weight (Gemma's norms multiply by 1 + weight); no rotary base is
  written (Gemma's 10000 holds), the head size is `attention.key_length`;
- smollm3: a llama-shaped file (q/k rows interleaved per head as for llama, `quant.permuted_rows`) whose layers
  without rotary embedding are not in the metadata: llama.cpp fixes them at every 4th layer, SmolLM3's own
  default (`no_rope_layer_interval` 4).

The tokenizer comes from transformers' own GGUF tokenizer reader, which does not depend on the architecture.
`handles(path)` says whether a file needs this (its architecture is one of ARCHITECTURES and transformers does
not read it itself); models.py then calls `load` instead of transformers' GGUF loader. The block weights are
taken from the file afterwards as for any GGUF (quant.gguf_blocks). Nothing here runs a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ARCHITECTURES = ("gemma", "smollm3")


def _fields(reader: Any) -> dict[str, Any]:
    """The file's metadata as plain values (strings decoded, one-element arrays unwrapped, token lists kept)."""
    import gguf

    values: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name == "tokenizer.ggml.tokens":
            values[name] = len(field.data)  # only the count is needed here
            continue
        if not field.types:
            continue
        parts = [field.parts[index] for index in field.data]
        if field.types[0] == gguf.GGUFValueType.STRING:
            decoded: list[Any] = [bytes(part).decode("utf-8", "replace") for part in parts]
        elif field.types[0] == gguf.GGUFValueType.ARRAY and len(field.types) > 1 and \
                field.types[1] == gguf.GGUFValueType.STRING:
            decoded = [bytes(part).decode("utf-8", "replace") for part in parts]
            values[name] = decoded
            continue
        else:
            decoded = [part.tolist()[0] if len(part) == 1 else part.tolist() for part in parts]
        values[name] = decoded[0] if len(decoded) == 1 and field.types[0] != gguf.GGUFValueType.ARRAY else decoded
    return values


def architecture(path: Path) -> str:
    """The file's `general.architecture` ('' when it has none)."""
    from gguf import GGUFReader

    return str(_fields(GGUFReader(str(path))).get("general.architecture", ""))


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


def handles(path: Path) -> bool:
    """Whether `load` is the way to read this file (an architecture here that transformers does not read)."""
    arch = architecture(path)
    return arch in ARCHITECTURES and not transformers_reads(arch)


def config_of(values: dict[str, Any], tensor_names: set[str]) -> Any:
    """The Hugging Face config a gemma or smollm3 GGUF describes (ValueError for a missing key)."""
    import transformers

    arch = values["general.architecture"]

    def key(name: str, default: Any = None) -> Any:
        value = values.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"the file has no {arch}.{name}")
        return value

    heads = int(key("attention.head_count"))
    settings: dict[str, Any] = dict(
        vocab_size=int(values.get("tokenizer.ggml.tokens") or key("vocab_size")),
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


def load(path: Path) -> tuple[Any, Any]:
    """(model in float32 and eval mode, tokenizer) from a gemma or smollm3 GGUF. Raises ValueError (or gguf's and
    transformers' own errors) for a file that does not hold what its metadata says."""
    import gguf
    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from .quant import permuted_rows

    reader = GGUFReader(str(path))
    values = _fields(reader)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = config_of(values, set(tensors))
    arch_name = values["general.architecture"]
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
        tensor = tensors[f"{found}.{suffix}"]
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        data = data.reshape(tuple(parameter.shape))
        if arch_name == "gemma" and base.endswith("norm"):
            data = data - 1  # stored as 1 + weight
        if arch_name == "smollm3" and found.endswith(("attn_q", "attn_k")):
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
