"""The target's weights in blocks: a GGUF's 4-bit and 8-bit blocks as stored, or blocks made on load (`--weights`).

A CPU decoding step is bound by reading weights: SmolLM2-135M dequantised to bfloat16 is 270 MB a token, its
GGUF ~85 MB. Here every linear layer whose weight can be held in blocks of 32 along the input dimension becomes a
`BlockLinear`, multiplied by specdec's CPU kernel (kernels/_cpu.c; each row of activations rounded to 8 bits per
block of 32 first, as llama.cpp does). What `--weights` means:

- `dense`: every weight dequantised to the compute dtype (0.2.0's path).
- `gguf`: a GGUF's Q4_0, Q4_1 and Q4_K tensors run as 4-bit blocks and its Q8_0 tensors as 8-bit blocks, exactly
  as stored (a Q4_K super-block's 6-bit scales and minimums become per-32 scales and offsets, exact in float32);
  tensors of any other type (F32, F16, BF16, Q5_*, Q6_K, Q2_K, Q3_K, IQ*) stay dense.
- `int8`: `gguf`, and every other linear layer quantised on load to 8-bit blocks (symmetric, scale = max|w|/127):
  a Hugging Face model becomes a different, smaller target, said so wherever the target is named.
- `int4`: a GGUF's 4-bit blocks as stored, and every other linear layer (Q8_0 ones too) quantised on load to
  4-bit blocks (scale = (max - min)/15, offset = min).
- `auto` (models.py decides): `gguf` for a GGUF on a CPU where a plain step measures faster than dense.

Every block weight taken from a GGUF is checked at conversion against the dense weight transformers dequantised
from the same tensor (including the row order of llama's permuted q/k projections); a tensor that does not match
stays dense. The result is cached as safetensors under $SPECDEC_HOME/weights, one file per model and mode.
Quantised models compute in float32 (the kernels take float32 rows). Exactness does not change: the kernels are
row-invariant, and exact.py verifies blocks against one-row forwards as for any model.
This file converts and caches weights; it does not choose a mode (models.py) or run anything but the check.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

import numpy as np
import torch

from .errors import SpecdecError
from .kernels import BLOCK

WEIGHTS = ("auto", "dense", "gguf", "int8", "int4")
BLOCK_MODES = ("gguf", "int8", "int4")
CACHE_FORMAT = 1  # bump when the cached file's layout or a conversion rule changes
BlockKind = Literal[4, 8]


@dataclass
class BlockWeights:
    """One weight [out, in] in blocks of 32 along `in`: kind 4 codes uint8 [out, in/32, 16] (weight i of a block in
    the low nibble of byte i, weight i + 16 in the high nibble) with W = scales * code + offsets; kind 8 codes int8
    [out, in/32, 32] with W = scales * code. scales, offsets float32 [out, in/32]."""

    kind: BlockKind
    codes: torch.Tensor
    scales: torch.Tensor
    offsets: Optional[torch.Tensor]
    origin: str  # "Q4_1" (a GGUF's own blocks), "int4" or "int8" (quantised on load)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.codes.shape[0]), int(self.codes.shape[1]) * BLOCK

    def dense(self) -> torch.Tensor:
        """The weight as float32 [out, in] (what the blocks mean; for checks and for drafters that read rows)."""
        if self.kind == 4:
            packed = self.codes.to(torch.int32)
            codes = torch.cat([packed & 15, packed >> 4], dim=-1).to(torch.float32)  # [out, in/32, 32]
            weight = codes * self.scales[..., None] + self.offsets[..., None]  # type: ignore[index]
        else:
            weight = self.codes.to(torch.float32) * self.scales[..., None]
        return weight.reshape(self.shape)


class BlockLinear(torch.nn.Module):
    """A linear layer on specdec's block kernel: float32 rows in, float32 rows out, bias added in float32."""

    records: torch.Tensor  # uint8 [out, record bytes] (kernels.pack_records)
    bias: Optional[torch.Tensor]

    def __init__(self, weights: BlockWeights, bias: Optional[torch.Tensor] = None):
        from . import kernels

        super().__init__()
        self.out_features, self.in_features = weights.shape
        self.kind, self.origin = weights.kind, weights.origin
        records = kernels.pack_records(weights.kind, weights.codes, weights.scales, weights.offsets)
        self.register_buffer("records", records, persistent=False)  # uint8 [out, record bytes]
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32), persistent=False)
        self._dense: Optional[torch.Tensor] = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from . import kernels

        rows = hidden.reshape(-1, self.in_features)  # [n, in]
        out = kernels.matmul(rows, self.kind, self.records)  # [n, out]
        if self.bias is not None:
            out += self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def blocks(self) -> BlockWeights:
        from . import kernels

        codes, scales, offsets = kernels.unpack_records(self.kind, self.records)
        return BlockWeights(self.kind, codes, scales, offsets, self.origin)

    @property
    def weight(self) -> torch.Tensor:
        """The dense float32 weight, made on first use (drafters that read the target's LM head rows use it)."""
        if self._dense is None:
            self._dense = self.blocks().dense()
        return self._dense

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={self.origin}"


def block_layers(model: Any) -> list[BlockLinear]:
    return [module for module in model.modules() if isinstance(module, BlockLinear)]


def weights_summary(model: Any) -> str:
    """'210 Q4_1 + 1 Q8_0 block layers, 0 dense' style, for the chat header and the bench report."""
    counts: dict[str, int] = {}
    for layer in block_layers(model):
        counts[layer.origin] = counts.get(layer.origin, 0) + 1
    dense = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    parts = [f"{count} {origin}" for origin, count in sorted(counts.items())]
    return f"{' + '.join(parts) or 'no'} block layers, {dense} dense"


# -- quantising dense weights on load ------------------------------------------------------------------------


def quantize_dense(weight: torch.Tensor, kind: BlockKind) -> BlockWeights:
    """Blocks of 32 for a dense weight [out, in]: kind 8 symmetric (scale = max|w|/127), kind 4 asymmetric
    (scale = (max - min)/15, offset = min), codes rounded to nearest."""
    out_features, in_features = weight.shape
    blocks = weight.detach().to(torch.float32).reshape(out_features, in_features // BLOCK, BLOCK)
    if kind == 8:
        scales = blocks.abs().amax(dim=-1) / 127  # [out, in/32]
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round(blocks / safe[..., None]).clamp(-127, 127).to(torch.int8)
        return BlockWeights(8, codes, scales, None, "int8")
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    scales = (high - low) / 15
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round((blocks - low[..., None]) / safe[..., None]).clamp(0, 15).to(torch.uint8)  # [out, in/32, 32]
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    return BlockWeights(4, packed, scales, low, "int4")


# -- a GGUF's own blocks --------------------------------------------------------------------------------------


def _halves(raw: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block row -> float32 [...]."""
    return np.ascontiguousarray(raw[..., start : start + 2]).view(np.float16)[..., 0].astype(np.float32)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of 6-bit scales and minimums for its 8 sub-blocks: bytes 0-3 hold scales 0-3 (low 6 bits)
    and the top 2 bits of scales 4-7, bytes 4-7 the same for minimums, bytes 8-11 the low 4 bits of scales 4-7
    (low nibble) and of minimums 4-7 (high nibble)."""
    first, second, low_bits = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([first & 63, (low_bits & 15) | ((first >> 6) << 4)], axis=-1)
    minimums = np.concatenate([second & 63, (low_bits >> 4) | ((second >> 6) << 4)], axis=-1)
    return scales.astype(np.float32), minimums.astype(np.float32)


def decode_gguf_blocks(type_name: str, raw: np.ndarray, out_features: int, in_features: int) -> Optional[BlockWeights]:
    """A GGUF tensor's raw bytes (type Q4_0, Q4_1, Q4_K or Q8_0) as kernel blocks; None for any other type.

    Layouts (ggml): Q4_0 = f16 scale + 16 bytes of nibbles per 32 weights, w = scale * (q - 8); Q4_1 = f16 scale,
    f16 minimum, 16 bytes, w = scale * q + minimum (nibble i holds weight i, its high half weight i + 16, as the
    kernel wants); Q8_0 = f16 scale + 32 int8, w = scale * q; Q4_K = super-blocks of 256: f16 d, f16 dmin, 12 bytes
    of 6-bit scales/minimums, 128 bytes where byte i of each 32-byte quarter holds weight i of one sub-block (low
    nibble) and of the next (high nibble); w = d * scale_j * q - dmin * minimum_j."""
    rows = np.asarray(raw).view(np.uint8).reshape(out_features, -1)
    blocks = in_features // BLOCK
    if type_name in ("Q4_0", "Q4_1"):
        size = 18 if type_name == "Q4_0" else 20
        data = rows.reshape(out_features, blocks, size)
        scale = _halves(data, 0)
        offset = -8 * scale if type_name == "Q4_0" else _halves(data, 2)
        codes = np.ascontiguousarray(data[..., size - 16 :])
        return BlockWeights(4, torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(offset), type_name)
    if type_name == "Q8_0":
        data = rows.reshape(out_features, blocks, 34)
        codes = np.ascontiguousarray(data[..., 2:]).view(np.int8)
        return BlockWeights(8, torch.from_numpy(codes), torch.from_numpy(_halves(data, 0)), None, type_name)
    if type_name == "Q4_K":
        data = rows.reshape(out_features, in_features // 256, 144)
        d, dmin = _halves(data, 0), _halves(data, 2)
        sub_scales, sub_minimums = _k_scales(data[..., 4:16])  # [out, supers, 8]
        quarters = data[..., 16:].reshape(out_features, -1, 4, 32)  # [out, supers, 4, 32]
        values = np.stack([quarters & 15, quarters >> 4], axis=3).reshape(out_features, blocks, BLOCK)  # 0..15
        codes = np.ascontiguousarray(values[..., :16] | (values[..., 16:] << 4)).astype(np.uint8)
        scale = (d[..., None] * sub_scales).reshape(out_features, blocks)
        offset = (-(dmin[..., None] * sub_minimums)).reshape(out_features, blocks)
        return BlockWeights(4, torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(offset), type_name)
    return None


def permuted_rows(out_features: int, heads: int) -> np.ndarray:
    """Row order of llama's q/k projections in a GGUF: llama.cpp's converter interleaves each head's two rotary
    halves (row h*dim + 2i + j holds Hugging Face row h*dim + j*dim/2 + i); index a GGUF weight with this to get
    the Hugging Face order."""
    half = out_features // heads // 2
    return np.arange(out_features).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)


def gguf_tensor_names(model: Any, reader: Any) -> dict[str, str]:
    """{model's linear layer name: GGUF tensor name} from gguf's own name map for the file's architecture."""
    import gguf

    arch_field = reader.fields.get("general.architecture")
    arch_name = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field is not None else ""
    arch = next((key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch_name), None)
    if arch is None:
        return {}
    name_map = gguf.get_tensor_name_map(arch, int(model.config.num_hidden_layers))
    names = {}
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            found = name_map.get_name(module_name)
            if found is not None:
                names[module_name] = f"{found}.weight"
    return names


def _matches(candidate: torch.Tensor, reference: torch.Tensor) -> bool:
    tolerance = 1e-5 * (1.0 + float(reference.abs().max()))
    return bool((candidate - reference).abs().max() <= tolerance)


def gguf_blocks(model: Any, gguf_path: Path) -> Iterator[tuple[str, BlockWeights]]:
    """(linear layer name, its GGUF blocks) for every layer whose tensor is of a kernel type and matches the dense
    weight transformers loaded from the same file (tied output heads read `token_embd`)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    names = gguf_tensor_names(model, reader)
    config = model.config
    for module_name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module.in_features % BLOCK:
            continue
        tensor = tensors.get(names.get(module_name, "")) or (tensors.get("token_embd.weight") if module_name ==
                                                             "lm_head" and "output.weight" not in tensors else None)
        if tensor is None:
            continue
        weights = decode_gguf_blocks(tensor.tensor_type.name, tensor.data, module.out_features, module.in_features)
        if weights is None:
            continue
        reference = module.weight.detach().to(torch.float32)
        if not _matches(weights.dense(), reference):
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
            kind = tensor.name.split(".")[-2] if tensor.name.count(".") >= 2 else ""
            if kind not in heads:
                continue
            order = torch.from_numpy(permuted_rows(module.out_features, int(heads[kind])))
            weights = BlockWeights(weights.kind, weights.codes[order].contiguous(), weights.scales[order].contiguous(),
                                   None if weights.offsets is None else weights.offsets[order].contiguous(),
                                   weights.origin)
            if not _matches(weights.dense(), reference):
                continue
        yield module_name, weights


# -- converting a model, with a cache ---------------------------------------------------------------------


def plan_blocks(model: Any, mode: str, gguf_path: Optional[Path]) -> dict[str, BlockWeights]:
    """{linear layer name: its blocks} for `mode` (gguf, int8, int4); layers left out stay dense."""
    if mode not in BLOCK_MODES:
        raise SpecdecError(f"weights must be one of {', '.join(WEIGHTS)}, got {mode!r}", setting="weights")
    planned: dict[str, BlockWeights] = {}
    if gguf_path is not None:
        for name, weights in gguf_blocks(model, gguf_path):
            if mode == "int4" and weights.kind == 8:
                continue  # requantised to 4 bits below
            planned[name] = weights
    if mode in ("int8", "int4"):
        kind: BlockKind = 8 if mode == "int8" else 4
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name not in planned and module.in_features % BLOCK == 0:
                planned[name] = quantize_dense(module.weight, kind)
    return planned


def install_blocks(model: Any, planned: dict[str, BlockWeights]) -> int:
    """Replace the planned linear layers by BlockLinear (in place); returns how many were replaced."""
    modules = dict(model.named_modules())
    for name, weights in planned.items():
        parent_name, _, attribute = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        old = getattr(parent, attribute)
        setattr(parent, attribute, BlockLinear(weights, getattr(old, "bias", None)))
    if planned and getattr(model.config, "tie_word_embeddings", False) and "lm_head" in planned:
        model.config.tie_word_embeddings = False  # the head is its own (block) layer now; nothing re-ties it
    return len(planned)


def cache_file(home: Path, identity: str, mode: str) -> Path:
    digest = hashlib.sha256(f"{identity}|{mode}|{CACHE_FORMAT}".encode()).hexdigest()[:16]
    return home / "weights" / f"{mode}-{digest}.safetensors"


def load_cached(path: Path) -> Optional[dict[str, BlockWeights]]:
    """The planned blocks stored at `path`, or None when absent, foreign or unreadable (then converted again)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            if meta.get("format") != str(CACHE_FORMAT) or meta.get("kind") != "specdec-blocks":
                return None
            layers = json.loads(meta["layers"])
            planned = {}
            for name, info in layers.items():
                offsets = handle.get_tensor(f"{name}.offsets") if info["kind"] == 4 else None
                planned[name] = BlockWeights(info["kind"], handle.get_tensor(f"{name}.codes"),
                                             handle.get_tensor(f"{name}.scales"), offsets, info["origin"])
            return planned
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError):
        return None


def save_cached(path: Path, planned: dict[str, BlockWeights]) -> None:
    """Write the planned blocks atomically (a read-only home only costs a conversion next time)."""
    from safetensors.torch import save

    from .files import write_atomic

    tensors: dict[str, torch.Tensor] = {}
    layers = {}
    for name, weights in planned.items():
        tensors[f"{name}.codes"] = weights.codes.contiguous()
        tensors[f"{name}.scales"] = weights.scales.contiguous()
        if weights.offsets is not None:
            tensors[f"{name}.offsets"] = weights.offsets.contiguous()
        layers[name] = {"kind": weights.kind, "origin": weights.origin}
    meta = {"format": str(CACHE_FORMAT), "kind": "specdec-blocks", "layers": json.dumps(layers)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, save(tensors, metadata=meta))
    except (OSError, SpecdecError):
        pass


def convert(model: Any, mode: str, gguf_path: Optional[Path], identity: str, home: Path) -> int:
    """Put `model` (float32, loaded dense) on block weights for `mode`, from the cache when it holds them."""
    path = cache_file(home, identity, mode)
    planned = load_cached(path)
    if planned is None or any(name not in dict(model.named_modules()) for name in planned):
        planned = plan_blocks(model, mode, gguf_path)
        save_cached(path, planned)
    return install_blocks(model, planned)
