"""The model families specdec knows, one row each: every fact about a family that more than one module needs.

A row (`Family`) says, for one transformers `model_type`: the `general.architecture` label its GGUF files carry
(a Mistral file is labelled llama, a Gemma 3 file gemma3), how its RMSNorm uses its weight (Gemma's multiply by
1 + weight, and llama.cpp stores the 1 + weight), whether its embeddings are scaled by sqrt(hidden), whether
llama.cpp interleaves its q/k rows per head, whether a GGUF of it needs specdec's own loader (transformers' does not
read it), whether its attention takes tree masks, and what the native decoder computes for it (the tensors its
layers hold: QK-norms, sandwich norms, fused projections, q/k/v biases; the query scaling). Consumers read the
table through the functions below at call time (native.py, device/, tree_check.py, gguf_layout.py,
gguf_model.py, gguf_families.py, quant.py), so a row added here reaches each of them.

This file holds facts only: it reads no file, builds no model and imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Family:
    """One family's facts (see the module docstring)."""

    model_type: str  # transformers' config.model_type
    architecture: str  # a GGUF's general.architecture
    # RMSNorm multiplies by 1 + weight, and a GGUF stores 1 + weight: computed in place, a norm multiplies by the
    # stored value, bit for bit what the converted model's 1 + (stored - 1) gives for any value a converter stores
    # as float32 w + 1 (tests/specdec_cli/target_model/test_family_table.py)
    norm_plus_one: bool = False
    embedding_scale: bool = False  # embeddings multiplied by sqrt(hidden)
    permuted_qk: bool = False  # llama.cpp interleaves attn_q/attn_k rows per head (rotary halves)
    own_gguf_loader: bool = False  # transformers' GGUF loader does not read it (gguf_families.py does)
    trees: bool = True  # attention takes 4-D custom masks with explicit positions (tree_check.py)
    native: bool = True  # the native decoder computes it (native.py, device/)
    qk_norm: bool = False  # RMSNorm on each head of q and k (attn_q_norm, attn_k_norm)
    sandwich_norms: bool = False  # norms after attention and after the MLP too
    fused: bool = False  # attn_qkv, and ffn_up holding gate and up
    qkv_bias: bool = False  # biases on q, k and v
    query_pre_attn_scalar: bool = False  # scores scaled by query_pre_attn_scalar^-0.5, not head_dim^-0.5
    rope_factors: bool = False  # a GGUF may hold rope_freqs.weight (llama 3's frequency factors)


# in the order the native decoder's refusals list them
FAMILIES: dict[str, Family] = {family.model_type: family for family in (
    Family("llama", "llama", permuted_qk=True, rope_factors=True),
    Family("mistral", "llama", permuted_qk=True, rope_factors=True),
    Family("qwen2", "qwen2", qkv_bias=True),
    Family("qwen3", "qwen3", qk_norm=True),
    Family("gemma", "gemma", norm_plus_one=True, embedding_scale=True, own_gguf_loader=True),
    Family("gemma2", "gemma2", norm_plus_one=True, embedding_scale=True, sandwich_norms=True,
           query_pre_attn_scalar=True),
    Family("gemma3_text", "gemma3", norm_plus_one=True, embedding_scale=True, sandwich_norms=True, qk_norm=True,
           query_pre_attn_scalar=True),
    Family("phi3", "phi3", fused=True),
    Family("smollm3", "smollm3", permuted_qk=True, own_gguf_loader=True),
)}


def of_model_type(model_type: Optional[str]) -> Optional[Family]:
    """The family of a transformers model_type, or None."""
    return FAMILIES.get(model_type or "")


def require(model_type: Optional[str]) -> Family:
    """The family of a model_type a caller has checked is in the table (ValueError otherwise)."""
    family = of_model_type(model_type)
    if family is None:
        raise ValueError(f"{model_type} is not a family in specdec's table")
    return family


def of_architecture(architecture: Optional[str]) -> Optional[Family]:
    """The family a GGUF labelled `architecture` is read as (the first row with that label: llama for a Mistral
    file), or None."""
    return next((family for family in FAMILIES.values() if family.architecture == architecture), None)


def native_model_types() -> tuple[str, ...]:
    """The model types the native decoder computes, in table order."""
    return tuple(family.model_type for family in FAMILIES.values() if family.native)


def native_list() -> str:
    """'llama, mistral, ...': the native model types as refusals name them."""
    return ", ".join(native_model_types())


def is_native(model_type: Optional[str]) -> bool:
    family = of_model_type(model_type)
    return family is not None and family.native


def is_native_architecture(architecture: Optional[str]) -> bool:
    """Whether a GGUF labelled so is of a family the native decoder computes."""
    return any(family.native and family.architecture == architecture for family in FAMILIES.values())


def takes_trees(model_type: Optional[str]) -> bool:
    family = of_model_type(model_type)
    return family is not None and family.trees


def norm_plus_one(model_type: Optional[str]) -> bool:
    family = of_model_type(model_type)
    return family is not None and family.norm_plus_one


def own_loader_architectures() -> tuple[str, ...]:
    """GGUF architectures whose files transformers' GGUF loader may not read (gguf_families.py reads them)."""
    return tuple(family.architecture for family in FAMILIES.values() if family.own_gguf_loader)
