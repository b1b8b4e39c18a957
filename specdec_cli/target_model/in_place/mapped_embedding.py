"""A GGUF's token embeddings left in the mapped file: each looked-up row dequantised when a forward asks for it.

The table is never unpacked whole unless something asks for its `weight` (a drafter that reads every row); then
the float32 table is made once and kept. Rows are dequantised by gguf's reference dequantiser, as transformers'
loader dequantises the whole table, so a row here is the row a converted model holds.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..gguf.gguf_file import GGUFFile


class MappedEmbedding(torch.nn.Embedding):
    """Token embeddings left in the mapped GGUF: `forward(ids)` dequantises the rows asked for (gguf's reference
    dequantiser, as transformers' loader dequantises the whole table); `weight`, the whole table in float32, is
    made only when something asks for it (a drafter that reads every row), then kept."""

    def __init__(self, gguf: GGUFFile, name: str, embed_scale: Optional[float] = None):
        torch.nn.Module.__init__(self)
        info = gguf.tensors[name]
        self.num_embeddings, self.embedding_dim = info.shape
        self.padding_idx, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse = None, None, 2.0, \
            False, False
        self._gguf, self._name, self._type = gguf, name, info.type_name
        self._dense: Optional[torch.Tensor] = None
        if embed_scale is not None:  # gemma: sqrt(hidden) as transformers' float32 buffer
            self.register_buffer("embed_scale", torch.tensor(embed_scale), persistent=False)

    def blocks(self) -> tuple[str, np.ndarray]:
        """The table as the file holds it: its GGUF type and bytes uint8 [vocab, bytes per row] (mapped)."""
        return self._type, self._gguf.raw(self._name).reshape(self.num_embeddings, -1)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [n] -> float32 [n, hidden], unscaled."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        if self._dense is not None:
            return self._dense.index_select(0, ids)
        table = self._gguf.raw(self._name).reshape(self.num_embeddings, -1)  # [vocab, bytes per row]
        picked = table[ids.to(torch.int64).numpy()]
        dense = dequantize(picked, GGMLQuantizationType[self._type]).astype(np.float32, copy=False)
        return torch.from_numpy(np.ascontiguousarray(dense.reshape(len(picked), self.embedding_dim)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.rows(ids.reshape(-1)).reshape(*ids.shape, self.embedding_dim)
        scale = getattr(self, "embed_scale", None)
        return rows if scale is None else rows * scale

    def release_pages(self) -> None:
        """Let the table's pages that lookups read go from this process (read again when looked up)."""
        self._gguf.release(self._name)

    @property  # type: ignore[override,unused-ignore]
    def weight(self) -> torch.Tensor:  # type: ignore[override]
        if self._dense is None:
            self._dense = self.rows(torch.arange(self.num_embeddings))
        return self._dense
