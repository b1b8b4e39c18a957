"""The target's weights on the device, put there once: matrices as `Projection`s, norms in float32.

A block layer (quant.BlockLinear: a GGUF's blocks repacked for specdec's kernels, or blocks made on load) goes to
the device in one of two ways, chosen once per loaded target (`packed_wanted`):

- **at the file's bits** (with `SPECDEC_DEVICE_PACKED=1`, or where the dequantised matrices would not fit the
  GPU's free memory; Triton needed): a layer of a
  GGUF type the packed kernel takes (kernels.triton_layout.takes) is held as a PackedMatrix, built on the device a chunk
  of CHUNK_ROWS output rows at a time, and multiplied by kernels/triton_gemm.py: a token reads the file's 4.5 bits a
  weight of a Q4_K matrix, not 16; with `SPECDEC_DEVICE_KERNEL=words`, a Q4_K or Q6_K layer is held as a WordMatrix
  instead (codes in 32-bit words along the outputs) and multiplied by kernels/triton_words_gemm.py;
- **dense** (the default: faster on a GPU today, docs/gpu.md): its packed records are moved a chunk at a time and
  dequantised there (kernels.records.unpack_records and dequantize are torch code, so they run wherever the records
  are) into the compute dtype.

Host memory never holds more than one chunk's records beyond the mapped file, and never a float32 copy of the
model. A transformers linear layer is moved (and cast) as it is. The projections that read the same input are one
`Projection` (q|k|v, gate|up): one fused dense matrix (one GEMM), or, packed, a part per run of layers of one type
(a Q4_K_M file's q|k one matrix, its v another), their outputs side by side. A GGUF's token embeddings (left in
the mapped file, mapped_embedding.MappedEmbedding) are an `Embedding`: at the file's bits where packed (a step decodes
its rows), else dequantised on the host a chunk of rows at a time and moved.

Every tensor made here is on the device given; nothing here computes a forward (decoder.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from ...errors import SpecdecError, check_choice
from ...kernels import triton_gemm
from ...kernels.triton_gemm import PackedGemm
from ...kernels.triton_layout import PackedMatrix, takes
from ...kernels.triton_words_gemm import WordGemm
from ...kernels.triton_words_layout import WordMatrix, word_takes
from ..native.native import norm_multiplier
from ..native.native_support import projections
from .family import Family

CHUNK_ROWS = 4096  # output rows of a block matrix dequantised at a time on the device (and embedding rows)
PACKED_VARIABLE = "SPECDEC_DEVICE_PACKED"
KERNEL_VARIABLE = "SPECDEC_DEVICE_KERNEL"
KERNELS = ("bytes", "words")  # triton_gemm.py's kernel (the default), triton_words_gemm.py's for Q4_K and Q6_K


def packed_setting() -> str:
    """SPECDEC_DEVICE_PACKED as "" (unset), "0" or "1"; another value, or 1 without Triton, is one line (checked
    before a model loads, with SPECDEC_DEVICE_KERNEL: kernel_setting)."""
    kernel_setting()
    setting = os.environ.get(PACKED_VARIABLE, "").strip()
    if setting not in ("", "0", "1"):
        raise SpecdecError(f"{PACKED_VARIABLE} must be 0 (weights dequantised) or 1 (at the file's bits), got "
                           f"{setting!r}")
    if setting == "1" and not triton_gemm.available():
        raise SpecdecError(f"{PACKED_VARIABLE}=1 needs Triton (torch's CUDA builds ship it; `pip install triton`)")
    return setting


def kernel_setting() -> str:
    """SPECDEC_DEVICE_KERNEL, the kernel of matrices at the file's bits: "bytes" (unset: kernels/triton_gemm.py for
    every type) or "words" (kernels/triton_words_gemm.py for Q4_K and Q6_K matrices, triton_gemm.py for the rest;
    not yet measured on a GPU, docs/gpu.md); another value is one line."""
    return check_choice(os.environ.get(KERNEL_VARIABLE, "").strip().lower() or KERNELS[0], KERNELS, "kernel",
                        named=KERNEL_VARIABLE)


DENSE_FITS = 0.8  # dense weights are the default on a GPU whose free memory holds them within this share


def packed_wanted(device: torch.device, model: Any = None, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Weights at the file's bits with SPECDEC_DEVICE_PACKED=1 (a third of the memory; a CPU runs the kernel in
    Triton's interpreter: for tests), dequantised with 0. Unset: dequantised, which ran an 8B's plain decoding 2.7x
    faster on an H200 (docs/gpu.md, 2026-11-30), unless on cuda the model's block matrices dequantised to `dtype`
    would take more than DENSE_FITS of the GPU's free memory and the kernel can run there (Triton, compute
    capability 8.0 on): then at the file's bits, so that the model loads at all."""
    setting = packed_setting()
    if setting or device.type != "cuda" or model is None:
        return setting == "1"
    if not triton_gemm.available() or torch.cuda.get_device_capability(device) < (8, 0):
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return dense_bytes(model, dtype) > DENSE_FITS * free


def dense_bytes(model: Any, dtype: torch.dtype) -> int:
    """Bytes the model's block matrices of a type the packed kernel takes would take dequantised to `dtype`."""
    from ..native.quant import BlockLinear

    size = torch.empty(0, dtype=dtype).element_size()
    return sum(int(layer.out_features) * int(layer.in_features) * size for layer in model.modules()
               if isinstance(layer, BlockLinear) and takes(layer.kind, int(layer.in_features)))


def _norm(norm: Any, offset: bool, device: torch.device) -> tuple[torch.Tensor, float]:
    """An RMSNorm's float32 multiplier [dim] on the device (native.norm_multiplier: 1 + weight for Gemma) and its
    eps."""
    eps = float(getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6)
    return norm_multiplier(norm, offset).to(device), eps


def fill_matrix(out: torch.Tensor, layer: Any) -> None:
    """out [layer's outputs, inputs] (on the device, in the compute dtype) = the layer's weight."""
    from ...kernels.records import GROUP, dequantize, unpack_records
    from ..native.quant import BlockLinear

    if not isinstance(layer, BlockLinear):
        out.copy_(layer.weight.detach())
        return
    per_chunk = max(1, CHUNK_ROWS // GROUP)  # records (GROUP output rows each) per chunk
    records = layer.records
    for first in range(0, records.shape[0], per_chunk):
        part = records[first : first + per_chunk].to(out.device)  # uint8 [groups, record bytes]
        start = first * GROUP
        rows = min(part.shape[0] * GROUP, layer.out_features - start)
        codes, scales, offsets = unpack_records(layer.kind, part, rows)
        out[start : start + rows].copy_(dequantize(layer.kind, codes, scales, offsets))  # [rows, in]


class Projection:
    """The projections that read the same input, side by side along the outputs: h [rows, in] in the compute dtype
    -> float32 [rows, sum of outputs]. Either one fused dense matrix (`weight`, one GEMM) or parts, each a packed
    matrix's GEMM (kernels.triton_gemm.PackedGemm, or kernels.triton_words_gemm.WordGemm) or a dense matrix of its
    own, their outputs side by side."""

    def __init__(self, parts: list[Union["PackedGemm", "WordGemm", torch.Tensor]]):
        dense = len(parts) == 1 and isinstance(parts[0], torch.Tensor)
        self.weight: Optional[torch.Tensor] = parts[0] if dense else None  # type: ignore[assignment]  # [out, in]
        self.parts = [] if dense else parts

    @property
    def packed(self) -> bool:
        return any(not isinstance(part, torch.Tensor) for part in self.parts)

    @property
    def nbytes(self) -> int:
        parts = [self.weight] if self.weight is not None else self.parts
        return sum(part.numel() * part.element_size() if isinstance(part, torch.Tensor) else part.nbytes
                   for part in parts)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            return (h @ self.weight.t()).float()
        outs = [(h @ part.t()).float() if isinstance(part, torch.Tensor) else part(h) for part in self.parts]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)  # [rows, sum of outputs]


def fused(layers: list[Any], device: torch.device, dtype: torch.dtype,
          packed: bool = False) -> tuple[Projection, Optional[torch.Tensor]]:
    """The layers as one Projection and their biases (float32 [sum of outputs] or None), on the device. Where
    `packed`, a layer whose type the packed GEMM takes stays at the file's bits, and adjacent ones of one type share
    a matrix (q|k, gate|up in a Q4_K_M file: one launch), in words where SPECDEC_DEVICE_KERNEL=words and the type
    is Q4_K or Q6_K; the rest are dense."""
    from ..native.quant import BlockLinear

    widths = [int(layer.out_features) for layer in layers]
    at_bits = [packed and isinstance(layer, BlockLinear) and takes(layer.kind, int(layer.in_features))
               for layer in layers]
    biases = [torch.zeros(width, device=device) if getattr(layer, "bias", None) is None else
              layer.bias.detach().to(device=device, dtype=torch.float32) for layer, width in zip(layers, widths)]
    bias = torch.cat(biases) if any(getattr(layer, "bias", None) is not None for layer in layers) else None
    if not any(at_bits):  # one dense matrix, filled in place
        dense = torch.empty(sum(widths), int(layers[0].in_features), dtype=dtype, device=device)
        start = 0
        for layer, width in zip(layers, widths):
            fill_matrix(dense[start : start + width], layer)
            start += width
        return Projection([dense]), bias
    runs: list[list[int]] = []  # adjacent layers at the file's bits of one kind share a run; a dense layer is alone
    for index, layer in enumerate(layers):
        last = runs[-1][-1] if runs else None
        if last is not None and at_bits[index] and at_bits[last] and layers[last].kind == layer.kind:
            runs[-1].append(index)
        else:
            runs.append([index])
    words = packed and kernel_setting() == "words"
    parts: list[Union[PackedGemm, WordGemm, torch.Tensor]] = []
    for run in runs:
        first = layers[run[0]]
        if at_bits[run[0]]:
            run_layers = [layers[index] for index in run]
            if words and word_takes(first.kind, int(first.in_features)):
                parts.append(WordGemm(WordMatrix.from_layers(run_layers, device, CHUNK_ROWS)))
            else:
                parts.append(PackedGemm(PackedMatrix.from_layers(run_layers, device, CHUNK_ROWS)))
        else:
            matrix = torch.empty(int(first.out_features), int(first.in_features), dtype=dtype, device=device)
            fill_matrix(matrix, first)
            parts.append(matrix)
    return Projection(parts), bias


class Embedding:
    """Token embeddings on the device: ids [rows] -> float32 [rows, hidden], unscaled. A dense table [vocab, hidden]
    in the compute dtype, or a GGUF's table at the file's bits (`packed`), whose rows are decoded as gguf decodes
    them (in float32, a step's rows only)."""

    def __init__(self, table: Optional[torch.Tensor] = None, packed: Optional[PackedMatrix] = None):
        self.table, self.packed = table, packed

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.nbytes
        assert self.table is not None
        return self.table.numel() * self.table.element_size()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return self.packed.dequantize(ids)
        assert self.table is not None
        return self.table.index_select(0, ids).float()


def packed_from_gguf(type_name: str, raw: Any, device: torch.device) -> PackedMatrix:
    """A GGUF tensor's bytes (uint8 [rows, bytes per row]: a mapped file's token embeddings, a benchmark's random
    blocks) on the device at the file's bits, CHUNK_ROWS rows at a time through gguf_decode.gguf_fields."""
    import numpy as np

    from ...kernels.packed import KIND_OF_GGUF_TYPE, PACKED, Fields
    from ..gguf.gguf_decode import GGUF_BLOCKS, gguf_fields

    kind = KIND_OF_GGUF_TYPE[type_name]
    block_bytes, per_block = GGUF_BLOCKS[type_name]
    n, k = raw.shape[0], raw.shape[1] // block_bytes * per_block
    matrix = PackedMatrix.allocate(kind, n, k, device)

    def moved(field: Any) -> Any:
        return None if field is None else torch.as_tensor(np.asarray(field)).to(device)

    for start in range(0, n, CHUNK_ROWS):
        part = np.ascontiguousarray(raw[start : start + CHUNK_ROWS])
        fields = gguf_fields(type_name, part.reshape(part.shape[0], k // PACKED[kind].super_block, -1))
        matrix.fill(start, Fields(moved(fields.codes), moved(fields.d), moved(fields.m), moved(fields.scales),
                                  moved(fields.minimums)))
    return matrix


def embedding_table(embed: Any, device: torch.device, dtype: torch.dtype, packed: bool = False) -> Embedding:
    """The token embeddings on the device: a GGUF's table at the file's bits where `packed` and its type allows,
    else dense (unscaled; from a GGUF a chunk of rows at a time)."""
    rows = getattr(embed, "rows", None)  # mapped_embedding.MappedEmbedding: rows dequantised on demand
    if rows is None:
        return Embedding(embed.weight.detach().to(device=device, dtype=dtype))
    if packed:
        from ...kernels.packed import KIND_OF_GGUF_TYPE

        type_name, raw = embed.blocks()
        if type_name in KIND_OF_GGUF_TYPE and takes(KIND_OF_GGUF_TYPE[type_name], int(embed.embedding_dim)):
            return Embedding(packed=packed_from_gguf(type_name, raw, device))
    table = torch.empty(int(embed.num_embeddings), int(embed.embedding_dim), dtype=dtype, device=device)
    for first in range(0, table.shape[0], CHUNK_ROWS):
        ids = torch.arange(first, min(first + CHUNK_ROWS, table.shape[0]))
        table[first : first + len(ids)].copy_(rows(ids))
    return Embedding(table)


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # float32 [hidden]
    attn_eps: float
    qkv: Projection  # [hidden] -> [q + 2 kv widths]
    qkv_bias: Optional[torch.Tensor]  # float32 [q + 2 kv widths]
    q_norm: Optional[torch.Tensor]  # float32 [head_dim]
    k_norm: Optional[torch.Tensor]
    qk_eps: float
    out: Projection  # [q width] -> [hidden]
    post_attn_norm: Optional[torch.Tensor]  # float32 [hidden] (gemma2/3)
    mlp_norm: torch.Tensor  # float32 [hidden]
    mlp_eps: float
    gate_up: Projection  # [hidden] -> [2 ffn]
    down: Projection  # [ffn] -> [hidden]
    post_mlp_norm: Optional[torch.Tensor]  # float32 [hidden] (gemma2/3)


@dataclass
class DeviceWeights:
    """Every weight of the target on one device."""

    device: torch.device
    dtype: torch.dtype
    embedding: Embedding  # ids [rows] -> float32 [rows, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # float32 [hidden]
    final_eps: float
    head: Projection  # [hidden] -> [vocab]

    @property
    def packed(self) -> bool:
        """Whether any matrix is held at the file's bits."""
        return self.head.packed or self.embedding.packed is not None or any(part.packed for layer in self.layers
                                       for part in (layer.qkv, layer.out, layer.gate_up, layer.down))

    @property
    def nbytes(self) -> int:
        """Bytes of the matrices and the embeddings on the device."""
        matrices = [self.head] + [part for layer in self.layers
                                  for part in (layer.qkv, layer.out, layer.gate_up, layer.down)]
        return sum(part.nbytes for part in matrices) + self.embedding.nbytes

    @staticmethod
    def load(model: Any, family: Family, device: torch.device, dtype: torch.dtype,
             packed: bool = False) -> "DeviceWeights":
        """The model's weights moved to `device` in `dtype`, layer by layer; block matrices at the file's bits
        where `packed` (packed_wanted) and their type allows."""
        offset = family.norm_offset
        layers = []
        with torch.no_grad():
            for layer in model.model.layers:
                attention = layer.self_attn
                linears = [module for _, module in projections(layer)]
                attention_inputs = linears[:1] if hasattr(attention, "qkv_proj") else linears[:3]
                qkv, qkv_bias = fused(attention_inputs, device, dtype, packed)
                out = fused([attention.o_proj], device, dtype, packed)[0]
                mlp = layer.mlp
                gate_up_layers = [mlp.gate_up_proj] if hasattr(mlp, "gate_up_proj") else [mlp.gate_proj, mlp.up_proj]
                gate_up = fused(gate_up_layers, device, dtype, packed)[0]
                down = fused([mlp.down_proj], device, dtype, packed)[0]
                sandwich = hasattr(layer, "pre_feedforward_layernorm")
                attn_norm, attn_eps = _norm(layer.input_layernorm, offset, device)
                mlp_norm, mlp_eps = _norm(layer.pre_feedforward_layernorm if sandwich else
                                          layer.post_attention_layernorm, offset, device)
                q_norm = getattr(attention, "q_norm", None)
                k_norm = getattr(attention, "k_norm", None)
                layers.append(LayerWeights(
                    attn_norm=attn_norm, attn_eps=attn_eps, qkv=qkv, qkv_bias=qkv_bias,
                    q_norm=None if q_norm is None else _norm(q_norm, offset, device)[0],
                    k_norm=None if k_norm is None else _norm(k_norm, offset, device)[0],
                    qk_eps=family.eps if q_norm is None else _norm(q_norm, offset, device)[1],
                    out=out,
                    post_attn_norm=_norm(layer.post_attention_layernorm, offset, device)[0] if sandwich else None,
                    mlp_norm=mlp_norm, mlp_eps=mlp_eps, gate_up=gate_up, down=down,
                    post_mlp_norm=_norm(layer.post_feedforward_layernorm, offset, device)[0] if sandwich else None))
            final_norm, final_eps = _norm(model.model.norm, offset, device)
            head = fused([model.lm_head], device, dtype, packed)[0]
            embedding = embedding_table(model.model.embed_tokens, device, dtype, packed)
        return DeviceWeights(device, dtype, embedding, layers, final_norm, final_eps, head)
