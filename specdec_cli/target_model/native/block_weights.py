"""One weight matrix as specdec's CPU kernels hold it: packed records of a kernel kind, and where they came from.

`BlockWeights` is the currency between the places that make blocks (gguf_decode.py from a GGUF's tensor bytes,
quant.quantize_dense from a dense weight, weights_cache.py from the cache) and the layer that multiplies by them
(quant.BlockLinear). It packs, unpacks, dequantises and reorders rows (q/k rows put in transformers' order); it
does not decode a file's bytes, choose a mode, or multiply.
"""

from __future__ import annotations

from typing import Optional

import torch

from ... import kernels


class BlockWeights:
    """One weight [out, in] as the kernels hold it: packed records of `kind` (kernels.KINDS) and where they came
    from (`origin`: a GGUF type such as "Q4_K", or "int4"/"int8" for blocks made on load)."""

    def __init__(self, kind: int, records: torch.Tensor, out_features: int, in_features: int, origin: str):
        self.kind, self.records, self.origin = kind, records, origin
        self.shape = (int(out_features), int(in_features))
        self._unpacked: Optional[tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]] = None
        self._fields: Optional[kernels.Fields] = None

    @classmethod
    def from_codes(cls, kind: int, codes: torch.Tensor, scales: Optional[torch.Tensor],
                   offsets: Optional[torch.Tensor], origin: str) -> "BlockWeights":
        """codes [out, in] one code a byte (float kinds: the weights), scales/offsets float32 [out, in/sub]."""
        records = kernels.pack_records(kind, codes, scales, offsets)
        weights = cls(kind, records, codes.shape[0], codes.shape[1], origin)
        weights._unpacked = (codes, scales, offsets)  # kept while converting (checks, q/k row order)
        return weights

    @classmethod
    def from_fields(cls, kind: int, fields: kernels.Fields, origin: str) -> "BlockWeights":
        """A packed kind (kernels/packed.py) from its fields [out, in]."""
        weights = cls(kind, kernels.pack_fields(kind, fields), fields.codes.shape[0], fields.codes.shape[1], origin)
        weights._fields = fields  # kept while converting (checks, q/k row order)
        return weights

    def fields(self) -> kernels.Fields:
        """A packed kind's fields (kernels.unpack_fields)."""
        return self._fields if self._fields is not None else kernels.unpack_fields(self.kind, self.records,
                                                                                   self.shape[0])

    def unpacked(self) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(codes [out, in], scales, offsets): kernels.unpack_records."""
        if self._unpacked is not None:
            return self._unpacked
        return kernels.unpack_records(self.kind, self.records, self.shape[0])

    def forget_unpacked(self) -> None:
        """Drop the codes kept from `from_codes` (a byte a weight): later calls unpack the records again."""
        self._unpacked = None
        self._fields = None

    def dense(self) -> torch.Tensor:
        """The weight as float32 [out, in] (what the blocks mean; for checks and for drafters that read rows)."""
        return kernels.dequantize(self.kind, *self.unpacked())

    def take(self, order: torch.Tensor) -> "BlockWeights":
        """The same blocks with the output rows in `order`."""
        if self.kind in kernels.PACKED:
            return BlockWeights.from_fields(self.kind, self.fields().take(order), self.origin)
        codes, scales, offsets = self.unpacked()
        return BlockWeights.from_codes(self.kind, codes[order], None if scales is None else scales[order],
                                       None if offsets is None else offsets[order], self.origin)
