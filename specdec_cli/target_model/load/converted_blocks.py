"""A model transformers loaded, put on block weights (`--weights gguf/int8/int4`): which layers, from where.

`gguf_blocks` reads a GGUF's tensors through gguf_file.py, decodes them with gguf_decode.py, puts llama.cpp's
interleaved q/k rows back in order where the family table says its converter interleaves them (families.py), and
keeps a layer's blocks only where they hold the weight transformers dequantised from the same tensor; `plan_blocks`
adds the layers quantised on load (quant.quantize_dense) for int8/int4; `convert` installs the plan
(quant.install_blocks), from the cache of converted weights when it holds it (weights_cache.py).
Not here: BlockLinear and quantising one matrix (quant.py), a GGUF computed in place (gguf_model.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from ... import kernels
from ...errors import check_choice
from ...kernels import BLOCK
from .. import families
from ..gguf.gguf_decode import decode_gguf_blocks, permuted_rows
from ..gguf.gguf_file import GGUFFile, open_gguf
from ..native.block_weights import BlockWeights
from ..native.quant import install_blocks, quantize_dense
from .load_settings import BLOCK_MODES
from .weights_cache import cache_file, load_cached, save_cached

# -- a GGUF's own blocks for a model transformers loaded -----------------------------------------------------


def gguf_tensor_names(model: Any, gguf: GGUFFile) -> dict[str, str]:
    """{model's linear layer name: GGUF tensor name} from gguf's own name map for the file's architecture."""
    import gguf as gguf_package

    arch = next((key for key, value in gguf_package.MODEL_ARCH_NAMES.items() if value == gguf.architecture), None)
    if arch is None:
        return {}
    name_map = gguf_package.get_tensor_name_map(arch, int(model.config.num_hidden_layers))
    names = {}
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            found = name_map.get_name(module_name)
            if found is not None:
                names[module_name] = f"{found}.weight"
    return names


def _matches(candidate: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether blocks hold the weight transformers loaded from the same tensor: equal within bfloat16's rounding
    (the conversion of a family computed by transformers is bfloat16; a row out of place is off by whole units)."""
    tolerance = 1e-5 * (1.0 + float(reference.abs().max()))
    return bool(((candidate - reference).abs() <= reference.abs() * 2.0**-8 + tolerance).all())


def gguf_blocks(model: Any, gguf_path: Path) -> Iterator[tuple[str, BlockWeights]]:
    """(linear layer name, its GGUF blocks) for every layer whose tensor is of a kernel type and matches the dense
    weight transformers loaded from the same file (tied output heads read `token_embd`). attn_q/attn_k rows are
    put in transformers' order where the family table says llama.cpp interleaves them; a family outside the table
    is tried both ways (llama.cpp's converter interleaves some of those too)."""
    gguf = open_gguf(gguf_path)
    names = gguf_tensor_names(model, gguf)
    family = families.of_architecture(gguf.architecture)
    config = model.config
    for module_name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module.in_features % BLOCK:
            continue
        name = names.get(module_name, "")
        if name not in gguf.tensors:
            name = "token_embd.weight" if module_name == "lm_head" and "output.weight" not in gguf.tensors else ""
        if name not in gguf.tensors:
            continue
        info = gguf.tensors[name]
        weights = decode_gguf_blocks(info.type_name, gguf.raw(name), module.out_features, module.in_features)
        if weights is None:
            continue
        reference = module.weight.detach().to(torch.float32)
        part = name.split(".")[-2] if name.count(".") >= 2 else ""
        if part in ("attn_q", "attn_k") and (family.permuted_qk if family is not None else
                                             not _matches(weights.dense(), reference)):
            heads = config.num_attention_heads if part == "attn_q" else config.num_key_value_heads
            weights = weights.take(torch.from_numpy(permuted_rows(module.out_features, int(heads))))
        if not _matches(weights.dense(), reference):
            continue
        weights.forget_unpacked()  # only the records are kept
        yield module_name, weights


# -- converting a model, with a cache ---------------------------------------------------------------------


def plan_blocks(model: Any, mode: str, gguf_path: Optional[Path]) -> dict[str, BlockWeights]:
    """{linear layer name: its blocks} for `mode` (gguf, int8, int4); layers left out stay dense."""
    check_choice(mode, BLOCK_MODES, "weights")
    planned: dict[str, BlockWeights] = {}
    if gguf_path is not None:
        for name, weights in gguf_blocks(model, gguf_path):
            bits = kernels.kind_of(weights.kind).bits
            if (mode == "int4" and bits != 4) or (mode == "int8" and bits >= 16):
                continue  # quantised on load below
            planned[name] = weights
    if mode in ("int8", "int4"):
        kind = kernels.KIND_Q8 if mode == "int8" else kernels.KIND_Q4
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name not in planned and module.in_features % BLOCK == 0:
                planned[name] = quantize_dense(module.weight, kind)
                planned[name].forget_unpacked()
    return planned


def convert(model: Any, mode: str, gguf_path: Optional[Path], identity: str, home: Path) -> int:
    """Put `model` (float32, loaded dense) on block weights for `mode`, from the cache when it holds them."""
    path = cache_file(home, identity, mode)
    planned = load_cached(path)
    if planned is None or any(name not in dict(model.named_modules()) for name in planned):
        planned = plan_blocks(model, mode, gguf_path)
        save_cached(path, planned)
    return install_blocks(model, planned)
